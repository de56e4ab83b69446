package service

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/netproxy"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/sandboxid"
	"github.com/vivarium-sandbox/vivarium/internal/snapshot"
)

// Paused sandboxes outlive the server (issue 15, docs/snapshots.md). Once
// a sandbox is paused, what its resume needs is written down in the
// background (sandbox.PausePersister) under PausedDir/<id>, as a snapshot
// is kept: data/ (the backend's), meta.json (the service's record of it:
// owner, timeouts, limits, environment, metadata) and a signature under
// the snapshot key. A resume or a close removes it; a shutdown keeps it.
// A new service opens every one it finds (sandbox.PausedOpener): the
// sandbox is listed again, paused, under its id, and resumes where it was.

// pausedMeta is a kept paused sandbox's meta.json.
type pausedMeta struct {
	ID         string            `json:"id"`
	Owner      string            `json:"owner"`
	CreatedAt  time.Time         `json:"created_at"`
	Deadline   time.Time         `json:"deadline"`
	ExpiresAt  time.Time         `json:"expires_at"`
	Idle       time.Duration     `json:"idle"`
	Limits     sandbox.Limits    `json:"limits"`
	Env        map[string]string `json:"env,omitempty"`
	IDEnv      []string          `json:"id_env,omitempty"`   // Box.idEnv
	IDStale    bool              `json:"id_stale,omitempty"` // Box.idStale
	Metadata   map[string]string `json:"metadata,omitempty"`
	Backend    string            `json:"backend"`
	Ports      PortOptions       `json:"ports"`
	OnTimeout  string            `json:"on_timeout,omitempty"`
	AutoResume bool              `json:"auto_resume,omitempty"`
	PausedAt   time.Time         `json:"paused_at"`
	Executions int               `json:"executions"`
	// Network is the access it had (its policy as a request), granted
	// again by the server that opens it: never more than that server's
	// allowlist allows then.
	Network *netpolicy.Request `json:"network,omitempty"`
	// Spec is what made it (Box.spec), nil where not known; PauseFiles
	// is Box.pauseFiles.
	Spec       *sandbox.Spec `json:"spec,omitempty"`
	PauseFiles bool          `json:"pause_files,omitempty"`
	// FilesOnly: it was paused without its memory (pausefiles.go), and
	// data/ holds its files for its resume to make it again of Spec.
	// Else data/ is its backend's (sandbox.PausePersister).
	FilesOnly bool `json:"files_only,omitempty"`
	// Volumes are the owner's volumes it mounts, leased again by the
	// server that opens it (reopenVolumes).
	Volumes []VolumeMountInfo `json:"volumes,omitempty"`
}

var errNoOpener = errors.New("its backend is not offered here, or cannot open paused sandboxes")

// pausedLockFile, in PausedDir, is locked (flock) by the one service that
// keeps paused sandboxes there: two servers given one data directory
// would otherwise both open, resume and remove the same sandboxes.
const pausedLockFile = ".lock"

// lockPaused takes PausedDir's lock, or says that another server holds
// it; paused sandboxes are then not kept by this one.
func (s *Service) lockPaused() error {
	if err := os.MkdirAll(s.cfg.PausedDir, 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(s.cfg.PausedDir, pausedLockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return fmt.Errorf("another server keeps its paused sandboxes in %s (its lock is held): one server per data directory", s.cfg.PausedDir)
	}
	s.pausedLock = f
	return nil
}

// keepsPaused says whether paused sandboxes are written down: configured
// to, and PausedDir's lock held.
func (s *Service) keepsPaused() bool {
	return s.pausedConfigured() && s.pausedLock != nil
}

func (s *Service) pausedConfigured() bool {
	return s.cfg.PausedDir != "" && len(s.cfg.SnapshotKey) >= snapshot.KeySize
}

// persistPaused writes b down, if it is still paused by the pause gen
// and its backend can. Run in the background after a pause, once the
// sandbox has stayed paused PersistDelay (at once when the server shuts
// down): the pause's answer does not wait for the disk, and a client
// pausing and resuming in a loop does not make the host write the
// sandbox's memory and files each time.
func (s *Service) persistPaused(b *Box, gen int) {
	defer s.persisting.Done()
	pp, ok := b.Sandbox().(sandbox.PausePersister)
	if !ok || !s.keepsPaused() {
		return
	}
	t := time.NewTimer(s.cfg.PersistDelay)
	select {
	case <-t.C:
	case <-s.stop:
		t.Stop()
	}
	b.pauseMu.Lock()
	defer b.pauseMu.Unlock()
	b.mu.Lock()
	paused := b.paused && b.pauseGen == gen && !b.persisted
	meta := b.pausedMeta()
	b.mu.Unlock()
	if !paused {
		return
	}
	start := time.Now()
	final := filepath.Join(s.cfg.PausedDir, b.id)
	size, err := s.writePaused(b, meta, func(data string) (int64, error) {
		return pp.PersistPaused(context.Background(), data)
	})
	if err != nil {
		if !errors.Is(err, ErrNotFound) {
			s.cfg.Logger.Warn("a paused sandbox is not kept across a restart", "id", b.id, "err", err)
		}
		return
	}
	// Kept on disk only from now on: the backend lets go of the rest
	// (its images, memory, host user, cgroup), and the resume reads the
	// kept copy, checked whole first, as after a restart.
	released := false
	if r, ok := b.Sandbox().(sandbox.PausedReleaser); ok {
		if err := r.ReleasePaused(filepath.Join(final, "data")); err != nil {
			s.cfg.Logger.Info("a paused sandbox kept on disk stays in memory as well", "id", b.id, "err", err)
		} else {
			released = true
		}
	}
	b.mu.Lock()
	b.persisted = true
	if released {
		b.unverified = true
	}
	b.mu.Unlock()
	s.cfg.Logger.Info("paused sandbox kept on disk", "id", b.id, "bytes", size, "ms", time.Since(start).Milliseconds(),
		"released", released)
}

// pausedMeta is b's record as a paused sandbox kept on disk. Callers
// hold b.mu.
func (b *Box) pausedMeta() pausedMeta {
	meta := pausedMeta{ID: b.id, Owner: b.owner, CreatedAt: b.createdAt, Deadline: b.deadline, ExpiresAt: b.expiresAt,
		Idle: b.idle, Limits: b.limits, Env: b.env, IDEnv: b.idEnv, IDStale: b.idStale, Metadata: b.metadata,
		Backend: b.backend, Ports: b.ports,
		OnTimeout: b.onTimeout, AutoResume: b.autoResume, PausedAt: b.pausedAt, Executions: b.executions,
		Spec: b.spec, PauseFiles: b.pauseFiles, Volumes: b.volumes}
	if p := b.network; !p.None() {
		meta.Network = &netpolicy.Request{Allow: p.Allow(), Deny: p.Denied(), Except: p.Excepted(), Packages: p.Packages,
			Limits: p.Limits}
	}
	return meta
}

// writePaused keeps b on disk, at PausedDir/<id>: data writes what its
// resume needs into the directory it is given (data/, which it makes),
// then meta is written and the whole signed. It is written under a
// staging name, renamed once signed: a crash leaves no half-written
// sandbox for the next start to list. It fails with ErrNotFound, and
// leaves nothing, where b was closed meanwhile.
func (s *Service) writePaused(b *Box, meta pausedMeta, data func(dir string) (int64, error)) (int64, error) {
	final := filepath.Join(s.cfg.PausedDir, b.id)
	dir := filepath.Join(s.cfg.PausedDir, ".partial-"+b.id)
	os.RemoveAll(final)
	os.RemoveAll(dir)
	err := os.Mkdir(dir, 0o700)
	var size int64
	if err == nil {
		size, err = data(filepath.Join(dir, "data"))
	}
	if err == nil {
		var buf []byte
		if buf, err = json.MarshalIndent(meta, "", "\t"); err == nil {
			err = os.WriteFile(filepath.Join(dir, "meta.json"), buf, 0o600)
		}
		if err == nil {
			// The record alone, checked at a start (openPaused); the
			// whole directory's signature at the resume.
			err = os.WriteFile(filepath.Join(dir, "meta.mac"), []byte(snapshot.MAC(buf, s.cfg.SnapshotKey)), 0o600)
		}
	}
	if err == nil {
		err = snapshot.Sign(dir, s.cfg.SnapshotKey)
	}
	if err == nil {
		err = os.Rename(dir, final)
	}
	s.mu.Lock()
	gone := s.boxes[b.id] != b
	s.mu.Unlock()
	if err == nil && gone {
		err = ErrNotFound
	}
	if err != nil {
		os.RemoveAll(dir)
		os.RemoveAll(final)
		return 0, err
	}
	return size, nil
}

// forgetPaused removes what persistPaused kept of b.
func (s *Service) forgetPaused(b *Box) {
	if !s.keepsPaused() {
		return
	}
	b.mu.Lock()
	b.persisted = false
	b.mu.Unlock()
	os.RemoveAll(filepath.Join(s.cfg.PausedDir, b.id))
}

// openPaused lists again the paused sandboxes an earlier server kept. One
// whose signature does not hold, or whose time paused is over, is
// removed; one the backend cannot open now is kept on disk for a later
// start, and said so.
func (s *Service) openPaused() {
	ents, _ := os.ReadDir(s.cfg.PausedDir)
	kept := map[string][]string{} // by backend: what is left on disk
	defer s.pruneBases(kept)
	for _, e := range ents {
		dir := filepath.Join(s.cfg.PausedDir, e.Name())
		if e.Name() == pausedLockFile {
			continue
		}
		if !sandboxid.Valid(e.Name()) {
			os.RemoveAll(dir) // a write cut short (.partial-<id>)
			continue
		}
		// Its record only, checked here: reading every kept sandbox
		// whole (Verify) would hold the start for as long; the resume
		// verifies it whole before the backend reads it.
		var m pausedMeta
		buf, err := os.ReadFile(filepath.Join(dir, "meta.json"))
		if err == nil {
			var mac []byte
			if mac, err = os.ReadFile(filepath.Join(dir, "meta.mac")); err == nil {
				err = snapshot.CheckMAC(buf, s.cfg.SnapshotKey, string(mac))
			}
			if errors.Is(err, snapshot.ErrTampered) {
				s.cfg.Logger.Warn("a kept paused sandbox is refused and removed", "id", e.Name(), "err", err)
				os.RemoveAll(dir)
				continue
			}
		}
		if err == nil {
			err = json.Unmarshal(buf, &m)
		}
		if err != nil || m.ID != e.Name() || m.Owner == "" {
			s.cfg.Logger.Warn("a kept paused sandbox has no record and is removed", "id", e.Name(), "err", err)
			os.RemoveAll(dir)
			continue
		}
		if s.cfg.Now().After(m.PausedAt.Add(s.cfg.MaxPaused)) {
			s.cfg.Logger.Info("sandbox closed", "id", m.ID, "why", "paused longer than the server keeps one")
			os.RemoveAll(dir)
			continue
		}
		if m.FilesOnly {
			s.openFilesPaused(m)
			continue
		}
		backend := cmp.Or(m.Backend, s.cfg.Backend.Name())
		kept[backend] = append(kept[backend], filepath.Join(dir, "data"))
		policy, egress := s.reopenNetwork(m)
		mounts, leases, lost := s.reopenVolumes(m)
		opener, ok := sandbox.BackendAs[sandbox.PausedOpener](s.cfg.Backend, m.Backend)
		var sb sandbox.Sandbox
		if !ok {
			err = errNoOpener
		} else {
			opts := sandbox.FromSnapshot{Tenant: s.tenantOf(m.Owner), Volumes: mounts}
			if egress != nil {
				opts.Egress = egress
			}
			sb, err = opener.OpenPaused(context.Background(), filepath.Join(dir, "data"), opts)
		}
		if err != nil {
			if egress != nil {
				egress.Close()
			}
			releaseVolumes(leases)
			s.cfg.Logger.Warn("a kept paused sandbox could not be opened; it stays on disk", "id", m.ID, "err", err)
			continue
		}
		b := s.opened(m, sb, policy, egress)
		b.leases, b.volumesLost = leases, lost
	}
}

// opened lists again, paused, the sandbox m records, of sb.
func (s *Service) opened(m pausedMeta, sb sandbox.Sandbox, policy *netpolicy.Policy, egress *netproxy.Proxy) *Box {
	b := &Box{
		id: m.ID, owner: m.Owner, sb: sb, createdAt: m.CreatedAt, deadline: m.Deadline, idle: m.Idle,
		limits: m.Limits, env: m.Env, idEnv: m.IDEnv, idStale: m.IDStale, metadata: m.Metadata, expiresAt: m.ExpiresAt,
		backend: m.Backend, spec: m.Spec, pauseFiles: m.PauseFiles,
		ports: m.Ports, onTimeout: m.OnTimeout, autoResume: m.AutoResume, paused: true, pausedAt: m.PausedAt,
		executions: m.Executions, pausable: true, persisted: true, unverified: true, network: policy, egress: egress,
		volumes: m.Volumes,
	}
	s.boxes[b.id] = b
	s.cfg.Logger.Info("paused sandbox opened from disk", "id", b.id, "owner", b.owner)
	return b
}

// pruneBases lets each backend that keeps files for its kept paused
// sandboxes (native's pause bases) remove those none of kept refers to.
func (s *Service) pruneBases(kept map[string][]string) {
	names := []string{s.cfg.Backend.Name()}
	if m, ok := s.cfg.Backend.(*sandbox.Mux); ok {
		names = m.Names()
	}
	for _, name := range names {
		if p, ok := sandbox.BackendAs[sandbox.BasePruner](s.cfg.Backend, name); ok {
			if err := p.PruneBases(kept[name]); err != nil {
				s.cfg.Logger.Warn("old pause bases are kept", "backend", name, "err", err)
			}
		}
	}
}

// reopenNetwork grants a kept paused sandbox the network access it had,
// as this server allows it now, and makes its proxy: nil, nil where it had
// none, or where this server no longer allows it (the log says so, and
// the sandbox resumes without network access).
func (s *Service) reopenNetwork(m pausedMeta) (*netpolicy.Policy, *netproxy.Proxy) {
	if m.Network == nil {
		return nil, nil
	}
	policy, err := s.grantNetwork(*m.Network, m.Backend)
	var egress *netproxy.Proxy
	if err == nil && !policy.None() {
		egress, err = s.newEgress(m.Owner, m.ID, policy)
	}
	if err != nil || egress == nil {
		s.cfg.Logger.Warn("a kept paused sandbox's network access is not granted again; it resumes without", "id", m.ID,
			"allow", m.Network.Allow, "err", err)
		return nil, nil
	}
	return policy, egress
}

// verifyOpened checks, before the first resume of a sandbox openPaused
// made, its whole directory against its signature: the backend (CRIU, as
// root) reads it then. Callers hold b.pauseMu.
func (s *Service) verifyOpened(b *Box) error {
	b.mu.Lock()
	unverified := b.unverified
	b.mu.Unlock()
	if !unverified {
		return nil
	}
	if err := snapshot.Verify(filepath.Join(s.cfg.PausedDir, b.id), s.cfg.SnapshotKey); err != nil {
		return fmt.Errorf("%w: the paused sandbox kept on disk: %v", sandbox.ErrInvalidSpec, err)
	}
	b.mu.Lock()
	b.unverified = false
	b.mu.Unlock()
	return nil
}
