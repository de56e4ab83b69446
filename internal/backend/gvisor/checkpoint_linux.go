package gvisor

// Pause and resume with runsc's own checkpoint and restore (the container
// layer's Checkpointer; the sequence is container/pause_linux.go's).
//
// `runsc checkpoint --image-path DIR ID` has gVisor's kernel save itself
// (every task's memory, its file descriptions, its own tmpfs, the agent
// and the runner where they wait) into DIR/checkpoint.img, compressed, and
// end: the sentry and the gofer exit, the `runsc run` that was the
// container returns, runsc deletes the container. `runsc restore
// --image-path DIR --bundle B ID` starts a sandbox from the same bundle
// (same mounts: the sandbox's root, its disk's workspace, tmp and shm; same
// cgroup; no network) and loads the kernel into it. A file the restored
// kernel had open on the host is reopened there: the sandbox's standard
// input and output, which were the old runsc's pipes, are the new runsc's
// (measured: a process reading its stdin in a loop carries on reading the
// new one), and so the agent is reached through the restore's pipes.
//
// What this runsc does not let a pause undo: a checkpoint that fails once
// the save has begun (a full disk: "write urpc: no space left on device")
// still ends the sandbox (the kernel is killed after a save, whatever its
// outcome), so the container layer checks the disk first and otherwise
// starts a new container with the same files.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/backend/container"
)

var (
	_ container.Checkpointer = (*sandboxContainer)(nil)
	_ container.Explainer    = (*sandboxContainer)(nil)
)

// CheckpointSupported implements container.Checkpointer. runsc cannot
// checkpoint a sandbox with the host's network stack (hostinet), GPU or
// TPU proxies, or when rootless; Vivarium's sandboxes have none of these
// (--network=none, root), on every platform runsc starts them with.
func (c *sandboxContainer) CheckpointSupported() error { return nil }

// Checkpoint implements container.Checkpointer: runsc saves the sandbox
// into dir and ends it. The image's pages are then dropped from the page
// cache: they were charged to the sandbox's cgroup (gVisor's kernel wrote
// them) and would stay there, the memory a pause is meant to free.
func (c *sandboxContainer) Checkpoint(_ context.Context, dir string) error {
	out, err := exec.Command(c.r.cfg.Runsc, append(c.r.globalArgs(), "checkpoint", "--image-path", dir, c.id)...).CombinedOutput()
	if err != nil {
		msg := lastLine(string(out))
		if msg == "" {
			msg = err.Error()
		}
		return fmt.Errorf("runsc checkpoint: %s", msg)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Type().IsRegular() {
			dropCache(filepath.Join(dir, e.Name()))
		}
	}
	return nil
}

// dropCache writes a file's pages to disk and drops them from the page
// cache.
func dropCache(path string) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	unix.Fdatasync(int(f.Fd()))
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

// Restore implements container.Checkpointer: `runsc restore`, of the same
// bundle and container id, is the new container, its standard input and
// output the restored agent's.
func (c *sandboxContainer) Restore(_ context.Context, dir string) (container.Container, error) {
	n := &sandboxContainer{r: c.r, id: c.id, bundle: c.bundle, cg: c.cg, done: make(chan struct{})}
	if err := n.start("restore", "--image-path", dir, "--bundle", c.bundle, c.id); err != nil {
		return nil, err
	}
	return n, nil
}

// restoreOverhead is what a restore of a sandbox takes beyond what it
// held at its checkpoint. runsc restores the kernel's memory file
// eagerly and decodes the rest of the image in the sentry's own heap,
// which it keeps: measured on this runsc (20221219), a sandbox's cgroup
// peaks during the restore at what it held plus 38 MiB (x = 41), 62 MiB
// (pandas imported), 55 MiB (a 100 MiB numpy array), and keeps most of
// it; a pandas sandbox of 73 MiB under a 110 MiB limit was killed while
// restoring.
const restoreOverhead = 80 << 20

// RestoreOverhead implements container.Checkpointer.
func (c *sandboxContainer) RestoreOverhead() int64 { return restoreOverhead }

// WhyEnded implements container.Explainer: runsc's error, once the
// container has ended. It is the first line runsc wrote ("running
// container: starting container: restoring container ...: header error:
// unexpected EOF"); a stack trace of the sentry's panic may follow.
func (c *sandboxContainer) WhyEnded() string {
	select {
	case <-c.done:
	default:
		return ""
	}
	first, _, _ := strings.Cut(strings.TrimSpace(c.log.String()), "\n")
	return lastLine(first)
}
