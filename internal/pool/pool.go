// Package pool keeps fresh sandboxes ready before anyone asks for them, so
// that creating one costs a queue pop. It wraps any sandbox.Backend and is
// one itself.
//
// Sandboxes are pooled per configuration: the whole Spec (limits,
// environment, interpreter, one-shot or not, tenant) is the key, and a
// request is served only by a sandbox made for exactly that configuration:
// a tenant's sandboxes come from pools of its own, made in its group. A pooled
// sandbox has run no code; once handed out it belongs to the caller and
// never comes back. Each configuration's target size follows demand: it
// starts at Min once the configuration's first sandbox (the first
// request's own) is made, a request that finds the pool empty raises it
// (up to Max), and a
// configuration nobody used for Idle is dropped. A tenant keeps at most
// Configs configurations ready (a template's is one): a new one drops its
// least recently used, so that no client, however many configurations it
// asks for, holds more than Configs*Max ready sandboxes.
package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Config configures a Pool.
type Config struct {
	Backend sandbox.Backend
	// Max is the most ready sandboxes per configuration (0: no pooling,
	// every Create goes to the backend).
	Max int
	// Min is how many a configuration keeps ready while in use.
	Min int
	// Idle drops a configuration unused that long (default 10 minutes).
	Idle time.Duration
	// Configs is the most configurations a tenant (Spec.Tenant) keeps
	// ready; a new one drops the tenant's least recently used (default
	// DefaultConfigs).
	Configs int
	Logger  *slog.Logger
}

// Pool is a sandbox.Backend with ready sandboxes.
type Pool struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	buckets map[string]*bucket
	evicted int64 // configurations dropped to make room for another
	closed  bool
	stop    chan struct{}
	wg      sync.WaitGroup
}

var (
	_ sandbox.Backend       = (*Pool)(nil)
	_ sandbox.EgressBackend = (*Pool)(nil)
	_ sandbox.EgressChooser = (*Pool)(nil)
	_ sandbox.VolumeBackend = (*Pool)(nil)
)

// VolumesSupported implements sandbox.VolumeBackend for the backend the
// pool keeps sandboxes of.
func (p *Pool) VolumesSupported() error {
	if vb, ok := p.cfg.Backend.(sandbox.VolumeBackend); ok {
		return vb.VolumesSupported()
	}
	return fmt.Errorf("the %s backend cannot mount volumes", p.cfg.Backend.Name())
}

// RootsSupported implements sandbox.RootBackend for the backend the pool
// keeps sandboxes of.
func (p *Pool) RootsSupported() error {
	if rb, ok := p.cfg.Backend.(sandbox.RootBackend); ok {
		return rb.RootsSupported()
	}
	return fmt.Errorf("the %s backend cannot run templates", p.cfg.Backend.Name())
}

// EgressSupported implements sandbox.EgressBackend for the backend the
// pool wraps.
func (p *Pool) EgressSupported() error { return sandbox.EgressSupported(p.cfg.Backend) }

// EgressSupportedBy implements sandbox.EgressChooser for the backend the
// pool creates with.
func (p *Pool) EgressSupportedBy(name string) error {
	return sandbox.EgressSupportedBy(p.cfg.Backend, name)
}

// bucket is one configuration's ready sandboxes.
type bucket struct {
	key      string
	spec     sandbox.Spec
	ready    []sandbox.Sandbox
	creating int
	target   int
	lastUse  time.Time
	lastMiss time.Time
	failedAt time.Time // the last creation error: refills pause a while
	failures int       // creation errors in a row: each doubles the pause
	hits     int64
	misses   int64
}

// New starts a pool.
func New(cfg Config) *Pool {
	if cfg.Idle <= 0 {
		cfg.Idle = 10 * time.Minute
	}
	if cfg.Min < 0 {
		cfg.Min = 0
	}
	if cfg.Min > cfg.Max {
		cfg.Min = cfg.Max
	}
	if cfg.Configs <= 0 {
		cfg.Configs = DefaultConfigs
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Pool{cfg: cfg, log: cfg.Logger, buckets: map[string]*bucket{}, stop: make(chan struct{})}
	p.wg.Add(1)
	go p.janitor()
	return p
}

// DefaultConfigs is Config.Configs's default: a tenant's default
// configuration, and a few templates or limits of its own.
const DefaultConfigs = 4

// Name implements sandbox.Backend.
func (p *Pool) Name() string { return p.cfg.Backend.Name() }

func key(spec sandbox.Spec) string {
	if len(spec.Env) == 0 {
		spec.Env = nil // no environment, however it was spelled
	}
	b, _ := json.Marshal(spec) // maps marshal in key order: equal specs, equal keys
	return string(b)
}

// Create implements sandbox.Backend: a ready sandbox for this exact
// configuration if there is one, a new one otherwise.
func (p *Pool) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if err := sandbox.CheckRoot(p.cfg.Backend, spec); err != nil {
		return nil, err
	}
	if p.cfg.Max <= 0 || spec.Egress != nil || len(spec.Volumes) > 0 {
		// A sandbox with network access or volumes is made for its
		// caller: its proxy and volumes are the caller's, and cannot
		// wait in a pool.
		if err := sandbox.CheckEgress(p.cfg.Backend, spec); err != nil {
			return nil, err
		}
		if err := sandbox.CheckVolumes(p.cfg.Backend, spec); err != nil {
			return nil, err
		}
		return p.cfg.Backend.Create(ctx, spec)
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	k := key(spec)
	now := time.Now()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, sandbox.ErrClosed
	}
	b, fresh := p.bucketLocked(k, spec)
	b.lastUse = now
	var stale []sandbox.Sandbox
	var got sandbox.Sandbox
	for len(b.ready) > 0 {
		sb := b.ready[0]
		b.ready = b.ready[1:]
		if pr, ok := sb.(sandbox.Prober); ok && !pr.Alive() {
			stale = append(stale, sb)
			continue
		}
		got = sb
		break
	}
	if got != nil {
		b.hits++
	} else {
		b.misses++
		b.lastMiss = now
		if !fresh {
			b.target = min(b.target+1, p.cfg.Max)
		}
	}
	if fresh {
		// A configuration's first request: its sandbox is made first,
		// with the host to itself, and the pool starts once it is (a
		// new template's first sandbox starts a whole interpreter, as
		// each refill of it does). One request is no sign of many at
		// once: the target stays Min until a miss raises it.
		p.mu.Unlock()
		sb, err := p.cfg.Backend.Create(ctx, spec)
		if err == nil {
			p.mu.Lock()
			if p.buckets[k] == b {
				p.refillLocked(b)
			}
			p.mu.Unlock()
		}
		return sb, err
	}
	p.refillLocked(b)
	p.mu.Unlock()
	for _, sb := range stale {
		go sb.Close()
	}
	if got != nil {
		return got, nil
	}
	return p.cfg.Backend.Create(ctx, spec)
}

// Prewarm declares a configuration worth keeping ready, n sandboxes deep.
func (p *Pool) Prewarm(spec sandbox.Spec, n int) {
	if p.cfg.Max <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	b, _ := p.bucketLocked(key(spec), spec)
	b.target = max(b.target, min(n, p.cfg.Max))
	b.lastUse = time.Now()
	p.refillLocked(b)
}

// bucketLocked is the configuration k's bucket; fresh, made now.
func (p *Pool) bucketLocked(k string, spec sandbox.Spec) (b *bucket, fresh bool) {
	b = p.buckets[k]
	if b == nil {
		p.makeRoomLocked(spec.Tenant)
		b = &bucket{key: k, spec: spec, target: p.cfg.Min}
		p.buckets[k] = b
		fresh = true
	}
	return b, fresh
}

// makeRoomLocked drops the least recently used configurations of tenant
// until it has room for one more; their ready sandboxes are closed, and
// their refills in flight close what they make.
func (p *Pool) makeRoomLocked(tenant string) {
	for {
		var mine []*bucket
		for _, b := range p.buckets {
			if b.spec.Tenant == tenant {
				mine = append(mine, b)
			}
		}
		if len(mine) < p.cfg.Configs {
			return
		}
		lru := slices.MinFunc(mine, func(a, b *bucket) int { return a.lastUse.Compare(b.lastUse) })
		delete(p.buckets, lru.key)
		drop := lru.ready
		lru.ready = nil
		p.evicted++
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for _, sb := range drop {
				sb.Close()
			}
		}()
	}
}

// refillLocked starts creations until ready and in-flight sandboxes reach
// the target. One creation at a time per configuration: the backend's own
// throughput is the limit, and requests that miss create their own. After
// a creation failed, refills pause: a second, doubled with each failure
// in a row, up to maxFailurePause.
func (p *Pool) refillLocked(b *bucket) {
	if p.closed || b.creating > 0 || len(b.ready) >= b.target || time.Since(b.failedAt) < b.pause() {
		return
	}
	b.creating++
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			sb, err := p.cfg.Backend.Create(ctx, b.spec)
			cancel()
			p.mu.Lock()
			if err != nil {
				b.creating--
				b.failedAt = time.Now()
				b.failures++
				p.mu.Unlock()
				p.log.Warn("pool: could not make a sandbox", "err", err)
				return
			}
			if p.closed || p.buckets[b.key] != b {
				b.creating--
				p.mu.Unlock()
				sb.Close()
				return
			}
			b.failures = 0
			b.ready = append(b.ready, sb)
			if len(b.ready) >= b.target {
				b.creating--
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
		}
	}()
}

// maxFailurePause bounds the pause of a configuration's refills after
// creations failed in a row.
const maxFailurePause = time.Minute

// pause is how long refills wait after the last creation error.
func (b *bucket) pause() time.Duration {
	if b.failures == 0 {
		return 0
	}
	return min(time.Second<<min(b.failures-1, 6), maxFailurePause)
}

// janitor drops configurations nobody uses and shrinks those whose demand
// fell: a target decays by one for every minute without a miss. Every
// second it also closes the ready sandboxes that died while they waited
// (a gVisor sandbox whose runsc was killed, say) and refills what is
// short, so that a failure is replaced before a request finds it.
func (p *Pool) janitor() {
	defer p.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		var drop []sandbox.Sandbox
		dead := 0
		p.mu.Lock()
		for k, b := range p.buckets {
			switch {
			case now.Sub(b.lastUse) > p.cfg.Idle:
				drop = append(drop, b.ready...)
				b.ready = nil
				delete(p.buckets, k)
			case now.Sub(b.lastMiss) > time.Minute && b.target > p.cfg.Min:
				b.target--
				b.lastMiss = now
				if len(b.ready) > b.target {
					drop = append(drop, b.ready[b.target:]...)
					b.ready = slices.Clip(b.ready[:b.target])
				}
			}
			if p.buckets[k] == b {
				b.ready = slices.DeleteFunc(b.ready, func(sb sandbox.Sandbox) bool {
					if pr, ok := sb.(sandbox.Prober); ok && !pr.Alive() {
						drop = append(drop, sb)
						dead++
						return true
					}
					return false
				})
				p.refillLocked(b)
			}
		}
		p.mu.Unlock()
		if dead > 0 {
			p.log.Warn("pool: ready sandboxes died while they waited; they are replaced", "count", dead)
		}
		for _, sb := range drop {
			sb.Close()
		}
	}
}

// Stat describes one configuration of the pool.
type Stat struct {
	Spec     sandbox.Spec
	Ready    int
	Creating int
	Target   int
	Hits     int64
	Misses   int64
	// MemoryBytes is the ready sandboxes' proportional set size, where
	// the backend can tell.
	MemoryBytes int64
}

// Stats describes the pool, with what its ready sandboxes cost at rest.
func (p *Pool) Stats() []Stat {
	p.mu.Lock()
	var out []Stat
	var ready [][]sandbox.Sandbox
	for _, b := range p.buckets {
		out = append(out, Stat{Spec: b.spec, Ready: len(b.ready), Creating: b.creating, Target: b.target,
			Hits: b.hits, Misses: b.misses})
		ready = append(ready, slices.Clone(b.ready))
	}
	p.mu.Unlock()
	for i, sbs := range ready {
		for _, sb := range sbs {
			if m, ok := sb.(sandbox.MemoryUser); ok {
				if n, err := m.MemoryPSS(); err == nil {
					out[i].MemoryBytes += n
				}
			}
		}
	}
	return out
}

// Evicted is how many configurations were dropped to make room for
// another of their tenant's (Config.Configs).
func (p *Pool) Evicted() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.evicted
}

// Close closes every ready sandbox and stops refilling. It does not close
// the backend.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	var all []sandbox.Sandbox
	for _, b := range p.buckets {
		all = append(all, b.ready...)
		b.ready = nil
	}
	p.mu.Unlock()
	close(p.stop)
	p.wg.Wait()
	var errs []error
	for _, sb := range all {
		errs = append(errs, sb.Close())
	}
	return errors.Join(errs...)
}

// Unwrap implements sandbox.Unwrapper: the backend the pool makes
// sandboxes with.
func (p *Pool) Unwrap() sandbox.Backend { return p.cfg.Backend }
