package container

// Snapshots (sandbox.Snapshotter; the backend's RestoreSnapshot makes
// sandboxes of them; issue 15, docs/snapshots.md), for runtimes whose
// containers are Checkpointers and that can start a new container from a
// checkpoint (Restorer: gVisor's runsc).
//
// runsc cannot save a sandbox and leave it running (its `checkpoint
// --leave-running` ends the container and starts another of the same id
// under the checkpoint command's own standard input and output, which are
// not the agent's; on this host's runsc it fails half-way and the sandbox
// is gone), so a snapshot is a pause and an immediate resume of the same
// sandbox. In order, under the pause's locks (no execution runs or starts,
// no command starts, none may run):
//
//  1. the container is checkpointed into the snapshot's image/ and ends
//     (saveContainer, as a pause);
//  2. while nothing runs, its disk (workspace, tmp, shm) is copied into
//     files/ (cp -a, owners kept): the files the image's memory saw;
//  3. the sandbox is restored from image/, as a resume restores it, and
//     goes on where it was (its Python state, processes, files);
//  4. snapshot.json: the spec, code contexts, the runner's generation,
//     each image's size, and what the image depends on (Restorer's
//     ImageKind: the runtime's version, platform, architecture).
//
// RestoreSnapshot makes a new sandbox of it, one of its own: a new id, state
// directory, cgroup (the snapshot's limits) and disk, filled with files/
// in that cgroup, then the runtime's RestoreAs of image/ with the new
// sandbox's bundle; Python's and numpy's random generators are reseeded
// unless asked not to be. The directory is root's (0700) and trusted:
// the service signs what it keeps and checks it before a restore.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

var _ sandbox.Snapshotter = (*Sandbox)(nil)

// Restorer is a Runtime that starts a new container from a checkpoint one
// of its containers made (Checkpointer.Checkpoint).
type Restorer interface {
	// RestoreAs starts a container from the checkpoint in dir as l says:
	// its id, disk and cgroup are l's, its processes the saved ones. Its
	// Stdin and Stdout are the restored agent's.
	RestoreAs(ctx context.Context, l Launch, dir string) (Container, error)
	// ImageKind names what a checkpoint depends on (the runtime's
	// version, its platform, the architecture): a checkpoint is restored
	// only by a runtime of the same kind.
	ImageKind() (string, error)
}

// snapshotVersion is snapshot.json's format.
const snapshotVersion = 1

// snapshotFile is a snapshot's description.
const snapshotFile = "snapshot.json"

// snapshotMeta is snapshot.json.
type snapshotMeta struct {
	Version int    `json:"version"`
	Backend string `json:"backend"`
	// Kind is the runtime's ImageKind when it was saved.
	Kind     string               `json:"kind"`
	Spec     sandbox.Spec         `json:"spec"`
	Contexts runner.ContextsState `json:"contexts"`
	// RunnerGen is the saved runner's generation, which the agent's
	// stream ids carry.
	RunnerGen uint32 `json:"runner_gen"`
	// Images are the checkpoint's files in image/, and their sizes.
	Images map[string]int64 `json:"images"`
}

// SnapshotSupported implements sandbox.Snapshotter: a sandbox that can be
// paused can be saved, where its runtime can start a new container from
// a checkpoint.
func (s *Sandbox) SnapshotSupported() error {
	if err := s.PauseSupported(); err != nil {
		return fmt.Errorf("%w (nor saved as a snapshot, or forked)", err)
	}
	return s.b.copiesSupported()
}

// copiesSupported says why the backend cannot make sandboxes of its
// sandboxes' checkpoints, if it cannot.
func (b *Backend) copiesSupported() error {
	rt, ok := b.cfg.Runtime.(Restorer)
	if !ok {
		return fmt.Errorf("%w: sandboxes of the %s backend cannot be saved as snapshots or forked (its runtime cannot start a container from a checkpoint)",
			sandbox.ErrUnsupported, b.Name())
	}
	if b.cfg.Users != nil {
		// A copy's files would be owned by the source's host user.
		return fmt.Errorf("%w: sandboxes of the %s backend, each a host user of its own, cannot be saved as snapshots or forked yet",
			sandbox.ErrUnsupported, b.Name())
	}
	if _, err := rt.ImageKind(); err != nil {
		return fmt.Errorf("%w: the %s backend's runtime: %v", sandbox.ErrUnsupported, b.Name(), err)
	}
	return nil
}

// SaveSnapshot implements sandbox.Snapshotter. The sandbox is
// checkpointed and restored at once (runsc cannot save a running
// sandbox): it goes on where it was, after a stop of about a pause and a
// resume. It fails with ErrBusy while an execution or a command runs, and
// ErrPaused for a paused sandbox; dir is made only if it succeeds. Were
// the sandbox's restore to fail, it runs again in a new container, with
// its files but not its Python state, and the error says so.
func (s *Sandbox) SaveSnapshot(ctx context.Context, dir string) (int64, error) {
	if err := s.SnapshotSupported(); err != nil {
		return 0, err
	}
	size, err := fileutil.WriteDir(dir, func(tmp string) error { return s.snapshot(ctx, tmp) })
	if err != nil {
		return 0, fmt.Errorf("snapshot: %w", err)
	}
	return size, nil
}

// snapshot saves the running sandbox into dir, which it makes.
func (s *Sandbox) snapshot(ctx context.Context, dir string) error {
	rt := s.b.cfg.Runtime.(Restorer)
	kind, err := rt.ImageKind()
	if err != nil {
		return err
	}
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	if s.closing.Load() {
		return sandbox.ErrClosed
	}
	if s.Core.Paused() {
		return fmt.Errorf("%w: resume it first", sandbox.ErrPaused)
	}
	return s.Exclusive(func() error {
		// A container that died while idle is replaced first, as an
		// execution would replace it.
		if err := (*driver)(s).Prepare(ctx); err != nil {
			return err
		}
		// Held throughout: a command that starts meanwhile waits for
		// the sandbox to run again.
		s.startGate.Lock()
		defer s.startGate.Unlock()
		if n := s.commandsRunning(); n > 0 {
			return fmt.Errorf("%w: %d command(s) started in the sandbox still run; wait for them or kill them first",
				sandbox.ErrBusy, n)
		}
		s.mu.Lock()
		r := s.runner
		s.mu.Unlock()
		if r == nil {
			return errors.New("the sandbox has no runner")
		}
		m := snapshotMeta{Version: snapshotVersion, Backend: s.b.Name(), Kind: kind, Spec: s.spec,
			RunnerGen: r.gen, Images: map[string]int64{}}
		if cc := s.Core.CloneContexts(); cc != nil {
			m.Contexts = cc.State()
		}
		image := filepath.Join(dir, "image")
		for _, d := range []string{dir, image} {
			if err := os.Mkdir(d, 0o700); err != nil {
				return err
			}
		}
		// Calls that need the container answer ErrPaused while it is
		// down.
		s.Core.SetPaused(true)
		defer s.Core.SetPaused(false)
		start := time.Now()
		if err := s.saveContainer(ctx, image); err != nil {
			return err
		}
		saved := time.Since(start)
		ferr := fileutil.CopyTree(s.disk.Dir, filepath.Join(dir, "files"), nil)
		copied := time.Since(start)
		if err := s.restoreSaved(ctx, image, r.gen); err != nil {
			return err
		}
		s.b.cfg.Logger.Debug("sandbox saved", "id", s.id, "checkpoint_ms", saved.Milliseconds(),
			"files_ms", (copied - saved).Milliseconds(), "stopped_ms", time.Since(start).Milliseconds())
		if ferr != nil {
			return fmt.Errorf("its files: %w", ferr)
		}
		if m.Images, err = imageSizes(image); err != nil {
			return err
		}
		return writeJSON(filepath.Join(dir, snapshotFile), m)
	})
}

// restoreSaved brings the sandbox back from the checkpoint a snapshot
// just made of it; where that fails, it runs again in a new container
// (its files kept, its Python state lost).
func (s *Sandbox) restoreSaved(ctx context.Context, image string, gen uint32) error {
	c, err := s.session().c.(Checkpointer).Restore(ctx, image)
	if err == nil {
		err = s.adopt(ctx, c, gen)
	}
	if err == nil {
		return nil
	}
	s.Core.SetPaused(false)
	if rerr := s.relaunch(context.WithoutCancel(ctx), true); rerr != nil {
		return fmt.Errorf("the sandbox could not be restored after its checkpoint (%v), and a new container did not start: %v", err, rerr)
	}
	return fmt.Errorf("the sandbox could not be restored after its checkpoint (%v): it runs again in a new container, with its files but not its Python state", err)
}

// RestoreSnapshot makes a new sandbox of the snapshot in dir (SaveSnapshot,
// or a paused sandbox's PersistPaused): its processes, files and code
// contexts as they were saved, its limits and environment the saved
// spec's, everything else its own. For a runtime that is a Restorer (the
// gvisor backend's CreateFromSnapshot).
func (b *Backend) RestoreSnapshot(ctx context.Context, dir string, opts sandbox.FromSnapshot) (sandbox.Sandbox, error) {
	s, m, err := b.openSnapshot(dir, opts)
	if err != nil {
		return nil, err
	}
	if err := s.restoreFrom(ctx, dir, m); err != nil {
		s.Close()
		return nil, fmt.Errorf("from snapshot: %w", err)
	}
	return sandbox.Reseed(ctx, s, opts.SameRandomState)
}

// openSnapshot reads the snapshot in dir and returns a sandbox of its spec
// and code contexts, that holds nothing yet.
func (b *Backend) openSnapshot(dir string, opts sandbox.FromSnapshot) (*Sandbox, *snapshotMeta, error) {
	if err := b.copiesSupported(); err != nil {
		return nil, nil, err
	}
	if opts.Egress != nil {
		if err := b.EgressSupported(); err != nil {
			return nil, nil, fmt.Errorf("%w: sandboxes of the %s backend have no network access: %v", sandbox.ErrUnsupported, b.Name(), err)
		}
	}
	m, err := b.loadSnapshot(dir)
	if err != nil {
		return nil, nil, err
	}
	spec := m.Spec
	spec.Tenant = opts.Tenant
	spec.Egress = opts.Egress // the proxy the copy is given: the checkpoint's agent listens for it
	if err := spec.Validate(); err != nil {
		return nil, nil, fmt.Errorf("snapshot: %w", err)
	}
	if spec.OneShot || len(spec.Volumes) > 0 {
		return nil, nil, errors.New("snapshot: its spec is not one of a sandbox that can be saved")
	}
	contexts := runner.NewContexts("/workspace")
	if m.Contexts.List != nil {
		if contexts, err = runner.ContextsFrom(m.Contexts); err != nil {
			return nil, nil, fmt.Errorf("snapshot: %w", err)
		}
	}
	return b.newSandbox(spec, contexts), m, nil
}

// loadSnapshot reads dir's snapshot.json and checks that its image is
// whole and of a kind this backend's runtime restores.
func (b *Backend) loadSnapshot(dir string) (*snapshotMeta, error) {
	buf, err := os.ReadFile(filepath.Join(dir, snapshotFile))
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	var m snapshotMeta
	if err := json.Unmarshal(buf, &m); err != nil {
		return nil, fmt.Errorf("snapshot: its %s: %w", snapshotFile, err)
	}
	if m.Version != snapshotVersion {
		return nil, fmt.Errorf("%w: a snapshot of format %d (this Vivarium reads %d)", sandbox.ErrUnsupported, m.Version, snapshotVersion)
	}
	if m.Backend != b.Name() {
		return nil, fmt.Errorf("%w: a snapshot of the %s backend, not the %s backend's", sandbox.ErrUnsupported, m.Backend, b.Name())
	}
	kind, err := b.cfg.Runtime.(Restorer).ImageKind()
	if err != nil {
		return nil, err
	}
	if m.Kind != kind {
		return nil, fmt.Errorf("%w: the snapshot was saved by %s, this host's %s backend is %s: a checkpoint is restored by the runtime that made it",
			sandbox.ErrUnsupported, m.Kind, b.Name(), kind)
	}
	if len(m.Images) == 0 {
		return nil, errors.New("snapshot: it names no image")
	}
	for name, size := range m.Images {
		if name == "" || strings.ContainsRune(name, '/') || name == "." || name == ".." {
			return nil, fmt.Errorf("snapshot: an image named %q", name)
		}
		fi, err := os.Lstat(filepath.Join(dir, "image", name))
		switch {
		case errors.Is(err, os.ErrNotExist):
			return nil, fmt.Errorf("snapshot: its image %s is missing", name)
		case err != nil:
			return nil, fmt.Errorf("snapshot: its image: %w", err)
		case !fi.Mode().IsRegular():
			return nil, fmt.Errorf("snapshot: its image %s is not a regular file", name)
		case fi.Size() != size:
			return nil, fmt.Errorf("snapshot: its image %s is damaged: %d bytes, %d saved", name, fi.Size(), size)
		}
	}
	if fi, err := os.Lstat(filepath.Join(dir, "files")); err != nil || !fi.IsDir() {
		return nil, errors.New("snapshot: its files are missing")
	}
	return &m, nil
}

// restoreFrom gives s, made by openSnapshot (or released while paused),
// its cgroup and disk (filled with the snapshot's files) and a container
// restored from the snapshot's image. On failure what it provisioned is
// the caller's to close (unprovision).
func (s *Sandbox) restoreFrom(ctx context.Context, dir string, m *snapshotMeta) error {
	start := time.Now()
	if err := s.provision(filepath.Join(dir, "files")); err != nil {
		return err
	}
	filled := time.Since(start)
	c, err := s.b.cfg.Runtime.(Restorer).RestoreAs(ctx, Launch{ID: s.id, Spec: s.spec, Disk: s.disk, Cgroup: s.group(),
		UID: s.uid, GID: s.gid}, filepath.Join(dir, "image"))
	if err != nil {
		return err
	}
	if err := s.adopt(ctx, c, m.RunnerGen); err != nil {
		return err
	}
	s.b.cfg.Logger.Debug("sandbox restored from a snapshot", "id", s.id, "files_ms", filled.Milliseconds(),
		"ms", time.Since(start).Milliseconds())
	return nil
}

// imageSizes lists the regular files of a checkpoint directory and their
// sizes.
func imageSizes(dir string) (map[string]int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	m := map[string]int64{}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			return nil, err
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("the checkpoint holds %s, not a regular file", e.Name())
		}
		m[e.Name()] = fi.Size()
	}
	if len(m) == 0 {
		return nil, errors.New("the checkpoint is empty")
	}
	return m, nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "\t")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}
