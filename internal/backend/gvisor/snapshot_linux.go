package gvisor

// Snapshots, fork and paused sandboxes kept on disk (issue 15,
// docs/snapshots.md): the container layer's (container/snapshot_linux.go,
// fork_linux.go, persist_linux.go), on runsc's checkpoint and restore.
// What runsc gives them here is a restore of a checkpoint as a new
// container: `runsc restore --image-path DIR --bundle B ID` with another
// sandbox's bundle (its own disk, cgroup, id) loads the saved kernel
// into it; one image restores any number of times, at once too.
//
// What runsc does not give: a save that leaves the sandbox running.
// `runsc checkpoint --leave-running` (this runsc, 20221219) saves the
// sandbox, destroys its container and restores another of the same id,
// whose standard input and output are the checkpoint command's, which
// then waits for it: not the agent's pipes. Measured here: the destroy
// timed out ("destroying container: stopping container: context deadline
// exceeded"), the checkpoint command failed with status 128 and the
// sandbox was gone (its `runsc run` killed). A snapshot is therefore a
// checkpoint and an immediate restore of the same sandbox.

import (
	"context"
	"fmt"
	"os/exec"
	"runtime"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/backend/container"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

var (
	_ container.Restorer       = (*Runtime)(nil)
	_ sandbox.SnapshotRestorer = (*Backend)(nil)
	_ sandbox.PausedOpener     = (*Backend)(nil)
)

// RestoreAs implements container.Restorer: `runsc restore` of the image
// in dir, with a bundle of l's (its disk, cgroup, container id).
func (r *Runtime) RestoreAs(ctx context.Context, l container.Launch, dir string) (container.Container, error) {
	if err := r.checkpointWorks(ctx); err != nil {
		return nil, err
	}
	bundle, err := r.writeBundle(l)
	if err != nil {
		return nil, err
	}
	c := &sandboxContainer{r: r, id: "vivarium-" + l.ID, bundle: bundle, done: make(chan struct{}), cg: l.Cgroup,
		restoredAs: true}
	if err := c.start("restore", "--image-path", dir, "--bundle", bundle, c.id); err != nil {
		return nil, err
	}
	return c, nil
}

// ImageKind implements container.Restorer: runsc's version, the
// platform and the architecture. gVisor's image format is its own and
// changes between versions; a checkpoint is restored on the platform it
// was made on.
func (r *Runtime) ImageKind() (string, error) {
	r.cpMu.Lock()
	defer r.cpMu.Unlock()
	if r.kind != "" {
		return r.kind, nil
	}
	out, err := exec.Command(r.cfg.Runsc, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("runsc --version: %w", err)
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	version, ok := strings.CutPrefix(first, "runsc version ")
	if !ok || version == "" {
		return "", fmt.Errorf("runsc --version: %q", first)
	}
	r.kind = fmt.Sprintf("runsc %s, platform %s, %s", version, r.cfg.Platform, runtime.GOARCH)
	return r.kind, nil
}

// CreateFromSnapshot implements sandbox.SnapshotRestorer: a new sandbox
// restored from a snapshot one of the backend's sandboxes saved
// (container.Sandbox.SaveSnapshot).
func (b *Backend) CreateFromSnapshot(ctx context.Context, dir string, opts sandbox.FromSnapshot) (sandbox.Sandbox, error) {
	return b.RestoreSnapshot(ctx, dir, opts)
}

// OpenPaused implements sandbox.PausedOpener: a paused sandbox of what a
// sandbox's PersistPaused wrote, that holds nothing until its resume.
func (b *Backend) OpenPaused(ctx context.Context, dir string, opts sandbox.FromSnapshot) (sandbox.Sandbox, error) {
	return b.Backend.OpenPaused(ctx, dir, opts)
}
