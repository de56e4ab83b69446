package native

// Paused sandboxes that outlive their server (sandbox.PausePersister and
// PausedOpener, issue 15, docs/snapshots.md). A pause keeps the
// sandbox's root files in memory, held by its mount namespace, which ends
// with the server. PersistPaused writes a paused sandbox down as a
// snapshot is written (snapshot_linux.go): its images, /proc masks, root
// files (copied out of the held namespace) and a manifest. A later
// server's OpenPaused makes a Sandbox of that directory that is paused
// and holds nothing (no host user, cgroup, process or memory); its Resume
// restores it as a fork's copy is restored (restoreFrom): a host user,
// cgroup and root tmpfs of its own, its Python state, files, code
// contexts and random generators as they were paused.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/workspace"
)

var (
	_ sandbox.PausePersister = (*Sandbox)(nil)
	_ sandbox.PausedReleaser = (*Sandbox)(nil)
	_ sandbox.PausedOpener   = (*Backend)(nil)
)

// PersistPaused implements sandbox.PausePersister: what a resume of the
// paused sandbox needs is written into dir (made here; it must not
// exist), for OpenPaused. The sandbox stays paused as it was, and its
// own resume does not need dir.
func (s *Sandbox) PersistPaused(ctx context.Context, dir string) (int64, error) {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	switch {
	case s.closing:
		return 0, sandbox.ErrClosed
	case s.persisted != nil:
		return 0, fmt.Errorf("%w: it was opened from disk paused, and is kept there", sandbox.ErrUnsupported)
	case s.cp == nil || !s.Core.Paused():
		return 0, errors.New("persist: the sandbox is not paused")
	}
	s.mu.Lock()
	rp := s.rp
	s.mu.Unlock()
	if rp == nil || rp.pid <= 0 {
		return 0, errors.New("persist: the paused sandbox's runner is not known")
	}
	if _, err := os.Lstat(dir); err == nil {
		return 0, fmt.Errorf("persist: %s exists", dir)
	}
	// Room on the host's disk: the images' size again, and the files.
	if err := checkpointRoom(filepath.Dir(dir), fileutil.DirSize(s.cp.images())); err != nil {
		return 0, err
	}
	// The root's files, through the held mount namespace; a template's
	// sandbox's writable layer.
	live := s.upperDir()
	if live == "" {
		live = filepath.Join(s.cp.dir, "persist-root")
		if err := os.Mkdir(live, 0o700); err != nil {
			return 0, err
		}
		defer os.Remove(live)
		if err := mountRootOf(s.cp.mntns, live); err != nil {
			return 0, fmt.Errorf("persist: %w", err)
		}
		defer unix.Unmount(live, unix.MNT_DETACH)
	}
	snap := s.snapshotOf(s.cp, live, rp.pid)
	switch base, err := s.b.pauseBaseFor(ctx, s); {
	case err != nil:
		s.b.log.Warn("persist: kept whole, without a base", "sandbox", s.id, "err", err)
	case base != nil:
		snap.base, snap.basePairs = base, criu.Pairs{uint32(rp.pid): uint32(base.info.RunnerNS)}
	}
	size, err := writeSnapshot(snap, dir, true)
	if err != nil {
		return 0, fmt.Errorf("persist: %w", err)
	}
	return size, nil
}

// ReleasePaused implements sandbox.PausedReleaser: the paused sandbox,
// written into dir by PersistPaused, becomes what OpenPaused would make of
// dir. Its images, the /proc masks' copies, its root tmpfs (held by its
// mount namespace and its workspace's descriptors), network namespace,
// cgroup and host user are let go; its resume restores dir as a restart's
// would (resumePersisted). A sandbox whose commands still run is not
// released.
func (s *Sandbox) ReleasePaused(dir string) error {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	switch {
	case s.closing:
		return sandbox.ErrClosed
	case s.persisted != nil:
		return nil
	case s.cp == nil || !s.Core.Paused():
		return errors.New("release: the sandbox is not paused")
	case s.Core.LiveCommands() > 0:
		// Their pipes are held until the resume joins them again.
		return fmt.Errorf("%w: commands it started still run; it stays paused in memory", sandbox.ErrUnsupported)
	}
	snap, err := s.b.loadSnapshot(dir)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	snap.spec.Tenant = s.spec.Tenant
	// Its proxy, whose listener the pause closed: the resume binds
	// another in the restored network namespace, as a hot resume does.
	snap.spec.Egress = s.spec.Egress
	// Its volumes, which the caller's leases keep: mounted anew at the
	// resume (volpause_linux.go).
	snap.spec.Volumes = s.spec.Volumes
	cp := s.cp
	s.cp = nil
	cp.close()
	// The files answer ErrPaused from now on. A file operation already
	// under way (an upload begun before the pause) holds its Dir: each
	// closes once its operations end (Dir.Close waits for them), and the
	// tmpfs's memory is freed with the last.
	s.dirMu.Lock()
	dirs := append([]*workspace.Dir{s.ws, s.rootAsUser, s.rootAsRoot}, s.oldDirs...)
	s.ws, s.rootAsUser, s.rootAsRoot, s.oldDirs = nil, nil, nil, nil
	s.dirMu.Unlock()
	for _, d := range dirs {
		if d != nil {
			go d.Close()
		}
	}
	if s.init != nil {
		<-s.dead()
		if s.init.pidfd >= 0 {
			s.init.awaitReaped()
			unix.Close(s.init.pidfd)
		}
		s.lifeMu.Lock()
		s.init = nil
		s.lifeMu.Unlock()
	}
	s.mu.Lock()
	if r := s.rp; r != nil {
		r.closePidfd()
		s.rp = nil
	}
	s.mu.Unlock()
	s.netns.close()
	if err := s.giveBack(); err != nil {
		s.b.log.Warn("release a paused sandbox", "sandbox", s.id, "err", err)
	}
	s.setGroup(nil) // a paused sandbox runs nothing that reads it
	s.persisted = snap
	return nil
}

// OpenPaused implements sandbox.PausedOpener: a paused sandbox of the
// directory PersistPaused wrote (which stays the caller's, and is read
// again by the Resume). It holds nothing until then; its files answer
// sandbox.ErrPaused.
func (b *Backend) OpenPaused(ctx context.Context, dir string, opts sandbox.FromSnapshot) (sandbox.Sandbox, error) {
	if _, err := b.criu(); err != nil {
		return nil, err
	}
	snap, err := b.loadSnapshot(dir)
	if err != nil {
		return nil, err
	}
	snap.spec.Tenant, snap.spec.Egress, snap.spec.Volumes = opts.Tenant, opts.Egress, opts.Volumes
	if err := snap.spec.Validate(); err != nil {
		return nil, fmt.Errorf("a paused sandbox on disk: %w", err)
	}
	for _, m := range snap.mounts {
		if m.volume != "" && sliceIndex(opts.Volumes, m.volume) < 0 {
			return nil, fmt.Errorf("%w: a paused sandbox on disk mounts a volume at %s, which it was not given",
				sandbox.ErrInvalidSpec, m.volume)
		}
	}
	s, err := b.newCopy(snap, newID())
	if err != nil {
		return nil, err
	}
	s.persisted = snap
	s.Core.SetPaused(true)
	return s, nil
}

// resumePersisted is Resume for a sandbox OpenPaused made; callers hold
// pauseMu. A failure before the restored tree runs leaves it paused, as
// it was; after, it is closed.
func (s *Sandbox) resumePersisted(ctx context.Context, bin string) error {
	snap := s.persisted
	return s.Exclusive(func() error {
		if _, err := s.restoreFrom(context.WithoutCancel(ctx), bin, snap); err != nil {
			if s.init != nil {
				// The tree ran: what it holds goes with a Close.
				s.Core.SetPaused(false)
				s.persisted = nil
				go s.Close()
				return fmt.Errorf("resume: %w; the sandbox is closed", err)
			}
			return fmt.Errorf("resume: %w", err)
		}
		s.persisted = nil
		s.Core.SetPaused(false)
		s.files.resumed()
		return nil
	})
}
