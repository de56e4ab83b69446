package service

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/netproxy"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/sandboxid"
)

// Fork makes n new sandboxes of an owner's running sandbox, each an exact
// copy of it at this moment (its processes' state and its files) and each
// a sandbox of its own (sandbox.Forker): listed, limited, timed out and
// closed apart from the source and from each other. They count against
// the owner's and the server's quotas, and have the source's limits,
// environment, metadata and timeouts (their lifetime starts now). The
// source goes on unchanged. It fails with sandbox.ErrBusy while code runs
// in the source, sandbox.ErrPaused when it is paused, ErrQuota where n
// more sandboxes are more than the owner or the server may have, and
// sandbox.ErrUnsupported where its backend cannot fork it.
func (s *Service) Fork(ctx context.Context, owner, id string, n int, opts sandbox.ForkOptions) ([]Info, error) {
	if err := sandbox.CheckForkCount(n); err != nil {
		return nil, err
	}
	src, err := s.Get(owner, id)
	if err != nil {
		return nil, err
	}
	f, ok := src.Sandbox().(sandbox.Forker)
	if !ok {
		return nil, fmt.Errorf("%w: sandboxes of the %s backend cannot be forked (the native backend's can, with CRIU)",
			sandbox.ErrUnsupported, src.backend)
	}
	if err := f.ForkSupported(); err != nil {
		return nil, err
	}
	if err := s.memoryRoom(src.backend, owner, n); err != nil {
		return nil, err
	}
	again, err := s.awake(ctx, src, "fork")
	if err != nil {
		return nil, err
	}
	defer again()
	if err := src.quietFor("fork"); err != nil {
		return nil, err
	}

	// The copies' slots first, as Create reserves one.
	ids := make([]string, n)
	for i := range ids {
		ids[i] = sandboxid.New(s.cfg.Node)
	}
	s.mu.Lock()
	if s.closed || s.draining {
		s.mu.Unlock()
		return nil, ErrShuttingDown
	}
	if len(s.boxes)+n > s.cfg.MaxTotal {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: %d more sandboxes are over the server's maximum of %d", ErrQuota, n, s.cfg.MaxTotal)
	}
	maxOwn, _ := s.cfg.Quota(owner)
	if maxOwn <= 0 {
		maxOwn = s.cfg.MaxPerOwner
	}
	if have := s.owned(owner); have+n > maxOwn {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: this key may have %d live sandboxes and has %d; %d copies are too many", ErrQuota,
			maxOwn, have, n)
	}
	for _, c := range ids {
		s.boxes[c] = nil
	}
	s.pending[owner] += n
	s.mu.Unlock()
	unreserve := func() {
		s.pending[owner] -= n
		if s.pending[owner] <= 0 {
			delete(s.pending, owner)
		}
	}

	volMounts, volLeases, err := s.forkVolumes(src, n)
	var proxies []*netproxy.Proxy
	if err == nil {
		proxies, err = s.forkNetwork(src, ids)
	}
	var copies []sandbox.Sandbox
	if err == nil {
		opts.Volumes = volMounts
		for _, p := range proxies {
			opts.Egress = append(opts.Egress, p)
		}
		done := s.use(src)
		copies, err = f.Fork(ctx, n, opts)
		done()
	}
	releaseAll := func() {
		for _, ls := range volLeases {
			releaseVolumes(ls)
		}
	}
	if err != nil {
		for _, p := range proxies {
			p.Close()
		}
		releaseAll()
		s.mu.Lock()
		for _, c := range ids {
			delete(s.boxes, c)
		}
		unreserve()
		s.mu.Unlock()
		return nil, err
	}
	now := s.cfg.Now()
	src.mu.Lock()
	idle, life, network := src.idle, src.deadline.Sub(src.createdAt), src.network
	boxes := make([]*Box, n)
	for i, sb := range copies {
		env, _ := withID(maps.Clone(src.env), src.idEnv, ids[i]) // the source's, valid, with the copy's id
		boxes[i] = &Box{
			id: ids[i], owner: owner, sb: sb, createdAt: now, deadline: now.Add(life), idle: idle,
			limits: src.limits, env: env, idEnv: src.idEnv, idStale: len(src.idEnv) > 0, metadata: maps.Clone(src.metadata),
			expiresAt: minTime(now.Add(idle), now.Add(life)), backend: src.backend, ports: src.ports,
			onTimeout: src.onTimeout, autoResume: src.autoResume, spec: specWithEnv(src.spec, env), pauseFiles: src.pauseFiles,
			pausable: pauseSupported(sb, src.backend) == nil,
		}
		if volLeases != nil {
			boxes[i].volumes, boxes[i].leases = slices.Clone(src.volumes), volLeases[i]
		}
		if proxies != nil {
			boxes[i].egress, boxes[i].network = proxies[i], network
		}
	}
	src.mu.Unlock()
	s.mu.Lock()
	unreserve()
	if s.closed {
		for _, c := range ids {
			delete(s.boxes, c)
		}
		s.mu.Unlock()
		for _, sb := range copies {
			sb.Close()
		}
		releaseAll()
		return nil, ErrShuttingDown
	}
	for _, b := range boxes {
		s.boxes[b.id] = b
	}
	s.mu.Unlock()
	out := make([]Info, n)
	for i, b := range boxes {
		out[i] = b.info()
	}
	s.cfg.Logger.Info("sandbox forked", "id", id, "copies", n)
	return out, nil
}

// awake makes a paused b run for a copy of it (verb: fork it, save it as
// a snapshot), as E2B's createSnapshot takes a paused sandbox, and returns
// what pauses it again once the copy is made; a running b is left as it
// is. The copy is of the sandbox as it resumed: its processes run
// meanwhile, for the few milliseconds the copy takes.
func (s *Service) awake(ctx context.Context, b *Box, verb string) (again func(), err error) {
	if !b.Paused() {
		return func() {}, nil
	}
	if err := s.resume(ctx, b); err != nil && !errors.Is(err, ErrNotPaused) {
		return nil, fmt.Errorf("resume the paused sandbox to %s it: %w", verb, err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pauseWait)
		defer cancel()
		if err := s.pause(ctx, b); err != nil && !errors.Is(err, ErrAlreadyPaused) {
			s.cfg.Logger.Warn("sandbox not paused again after its copy", "id", b.id, "err", err)
		}
	}, nil
}

// quietFor refuses to copy b (verb: fork it, save it as a snapshot) while
// it is paused or code runs in it. What else a copy cannot take (volumes,
// network access) its backend refuses (ForkSupported, SnapshotSupported).
func (b *Box) quietFor(verb string) error {
	b.mu.Lock()
	executing, paused := b.executing, b.paused
	b.mu.Unlock()
	switch {
	case paused:
		return fmt.Errorf("%w: resume it before you %s it", sandbox.ErrPaused, verb)
	case executing:
		return fmt.Errorf("%w: code is running; %s the sandbox once it ends", sandbox.ErrBusy, verb)
	}
	return nil
}

// forkNetwork makes the proxies of the copies, ids, of src where it has
// network access (nil where it has none): each copy's own, with src's
// policy, recording its connections under the copy's id. The caller
// closes them where the copies are not made.
func (s *Service) forkNetwork(src *Box, ids []string) ([]*netproxy.Proxy, error) {
	src.mu.Lock()
	policy := src.network
	src.mu.Unlock()
	if src.egress == nil {
		return nil, nil
	}
	if policy == nil {
		policy = &netpolicy.Policy{} // taken away (UpdateNetwork): none
	}
	out := make([]*netproxy.Proxy, 0, len(ids))
	for _, id := range ids {
		p, err := s.proxyFor(src.owner, id, policy)
		if err != nil {
			for _, q := range out {
				q.Close()
			}
			return nil, fmt.Errorf("the copies' network proxies: %w", err)
		}
		out = append(out, p)
	}
	return out, nil
}
