package container

// Paused sandboxes that outlive their server (sandbox.PausePersister,
// PausedReleaser; the backend's OpenPaused; issue 15, docs/snapshots.md),
// for runtimes that are Restorers. PersistPaused writes a paused sandbox
// down as a snapshot is written (snapshot_linux.go): its checkpoint's
// image, a copy of its disk, snapshot.json. ReleasePaused then lets go of
// what the sandbox holds (its checkpoint, its disk's memory, its cgroup),
// and OpenPaused makes, in a later server, a sandbox of such a directory
// that holds nothing either. Their resume restores the directory as a
// snapshot is restored (restoreFrom): a disk and a cgroup of their own
// again, the container restored from the image under the sandbox's id,
// its Python state, files and code contexts as they were paused (random
// generators included: it is the same sandbox).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
	"github.com/vivarium-sandbox/vivarium/internal/hostdisk"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

var (
	_ sandbox.PausePersister = (*Sandbox)(nil)
	_ sandbox.PausedReleaser = (*Sandbox)(nil)
)

// persistedDir is where a paused sandbox that holds nothing else is kept.
type persistedDir struct {
	dir  string
	meta *snapshotMeta
}

// PersistPaused implements sandbox.PausePersister: the paused sandbox's
// checkpoint image, a copy of its disk and snapshot.json are written into
// dir (made here; it must not exist). The sandbox stays paused as it was.
func (s *Sandbox) PersistPaused(ctx context.Context, dir string) (int64, error) {
	if err := s.b.copiesSupported(); err != nil {
		return 0, err
	}
	rt := s.b.cfg.Runtime.(Restorer)
	kind, err := rt.ImageKind()
	if err != nil {
		return 0, err
	}
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	switch {
	case s.closing.Load():
		return 0, sandbox.ErrClosed
	case s.persisted != nil:
		return 0, fmt.Errorf("%w: it is kept on disk already", sandbox.ErrUnsupported)
	case s.checkpoint == "" || !s.Core.Paused():
		return 0, errors.New("persist: the sandbox is not paused")
	}
	if _, err := os.Lstat(dir); err == nil {
		return 0, fmt.Errorf("persist: %s exists", dir)
	}
	s.mu.Lock()
	r := s.runner
	s.mu.Unlock()
	if r == nil {
		return 0, errors.New("persist: the paused sandbox has no runner")
	}
	images, err := imageSizes(s.checkpoint)
	if err != nil {
		return 0, fmt.Errorf("persist: %w", err)
	}
	// Room on the host's disk: the image again, and the files.
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return 0, err
	}
	need := fileutil.DirSize(s.checkpoint) + fileutil.DirSize(s.disk.Dir) + checkpointMargin
	if err := hostdisk.Fits(filepath.Dir(dir), need, "keeping the paused sandbox"); err != nil {
		return 0, err
	}
	m := snapshotMeta{Version: snapshotVersion, Backend: s.b.Name(), Kind: kind, Spec: s.spec, RunnerGen: r.gen,
		Images: images}
	if cc := s.Core.CloneContexts(); cc != nil {
		m.Contexts = cc.State()
	}
	size, err := fileutil.WriteDir(dir, func(tmp string) error {
		for _, d := range []string{tmp, filepath.Join(tmp, "image")} {
			if err := os.Mkdir(d, 0o700); err != nil {
				return err
			}
		}
		for name := range images {
			if err := fileutil.CopyNew(filepath.Join(s.checkpoint, name), filepath.Join(tmp, "image", name), 0o600); err != nil {
				return err
			}
		}
		if err := fileutil.CopyTree(s.disk.Dir, filepath.Join(tmp, "files"), nil); err != nil {
			return err
		}
		return writeJSON(filepath.Join(tmp, snapshotFile), m)
	})
	if err != nil {
		return 0, fmt.Errorf("persist: %w", err)
	}
	return size, nil
}

// ReleasePaused implements sandbox.PausedReleaser: the paused sandbox,
// written into dir by PersistPaused, becomes what OpenPaused would make
// of dir: its checkpoint is removed, its disk unmounted (its files'
// memory freed) and its cgroup destroyed; its files answer ErrPaused, and
// its resume restores dir.
func (s *Sandbox) ReleasePaused(dir string) error {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	switch {
	case s.closing.Load():
		return sandbox.ErrClosed
	case s.persisted != nil:
		return nil
	case s.checkpoint == "" || !s.Core.Paused():
		return errors.New("release: the sandbox is not paused")
	}
	m, err := s.b.loadSnapshot(dir)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	if err := os.RemoveAll(s.checkpoint); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	s.checkpoint = ""
	s.unprovision()
	s.persisted = &persistedDir{dir: dir, meta: m}
	return nil
}

// unprovision lets go of what provision gave the sandbox, its container
// gone: its workspace (closed once the file operations under way end),
// disk, state directory and cgroup.
func (s *Sandbox) unprovision() {
	s.mu.Lock()
	ws, cg := s.ws, s.cg
	s.ws, s.cg = nil, nil
	s.mu.Unlock()
	if ws != nil {
		go ws.Close()
	}
	if s.mounted {
		if err := unmountDisk(s.disk.Dir); err != nil {
			s.b.cfg.Logger.Warn("unmount a sandbox's disk", "id", s.id, "err", err)
		}
		s.mounted = false
	}
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
	if cg != nil {
		if err := cg.Destroy(); err != nil {
			s.b.cfg.Logger.Warn("destroy a sandbox's cgroup", "id", s.id, "err", err)
		} else if ss := s.session(); ss != nil {
			if c, ok := ss.c.(CgroupCleaner); ok {
				c.RemoveCgroups()
			}
		}
	}
}

// OpenPaused makes a paused sandbox of the directory PersistPaused wrote
// (which stays the caller's, and is read again by the resume). It holds
// nothing until then; its files answer sandbox.ErrPaused. For a runtime
// that is a Restorer (the gvisor backend's OpenPaused).
func (b *Backend) OpenPaused(_ context.Context, dir string, opts sandbox.FromSnapshot) (sandbox.Sandbox, error) {
	s, m, err := b.openSnapshot(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("a paused sandbox on disk: %w", err)
	}
	s.persisted = &persistedDir{dir: dir, meta: m}
	ss := newSession(noContainer{})
	close(ss.ended)
	s.sess.Store(ss)
	s.Core.SetPaused(true)
	return s, nil
}

// resumePersisted is Resume for a sandbox kept on disk; callers hold
// pauseMu and the core's Exclusive. A failure leaves it paused, holding
// nothing, as it was.
func (s *Sandbox) resumePersisted(ctx context.Context) error {
	p := s.persisted
	if _, err := s.b.loadSnapshot(p.dir); err != nil {
		return err
	}
	if err := s.restoreFrom(ctx, p.dir, p.meta); err != nil {
		s.unprovision()
		return err
	}
	s.persisted = nil
	return nil
}

// noContainer is the container of a sandbox opened paused from disk: none
// yet, ended.
type noContainer struct{}

var ended = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (noContainer) Stdin() io.WriteCloser          { return nopWriteCloser{} }
func (noContainer) Stdout() io.Reader              { return eofReader{} }
func (noContainer) Kill() error                    { return nil }
func (noContainer) Done() <-chan struct{}          { return ended }
func (noContainer) Stats() (cgroups.Stats, bool)   { return cgroups.Stats{}, false }
func (noContainer) Remove() error                  { return nil }
func (nopWriteCloser) Write(p []byte) (int, error) { return 0, io.ErrClosedPipe }
func (nopWriteCloser) Close() error                { return nil }
func (eofReader) Read([]byte) (int, error)         { return 0, io.EOF }

type (
	nopWriteCloser struct{}
	eofReader      struct{}
)
