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
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/agent"
	"github.com/vivarium-sandbox/vivarium/internal/backend/container"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

var (
	_ container.Checkpointer = (*sandboxContainer)(nil)
	_ container.Explainer    = (*sandboxContainer)(nil)
)

// CheckpointSupported implements container.Checkpointer. runsc cannot
// checkpoint a sandbox with the host's network stack (hostinet), GPU or
// TPU proxies, or when rootless; Vivarium's sandboxes have none of these
// (--network=none, root). gVisor documents checkpoint and restore on every
// platform; whether they work here is found by the backend's first pause
// (probeCheckpoint), and a platform where they did not is named here from
// then on.
func (c *sandboxContainer) CheckpointSupported() error {
	r := c.r
	r.cpMu.Lock()
	defer r.cpMu.Unlock()
	return r.cpErr
}

// Checkpoint implements container.Checkpointer: runsc saves the sandbox
// into dir and ends it. The image's pages are then dropped from the page
// cache: they were charged to the sandbox's cgroup (gVisor's kernel wrote
// them) and would stay there, the memory a pause is meant to free. The
// backend's first checkpoint is preceded by a probe's (probeCheckpoint):
// where that fails, nothing is done to this sandbox.
func (c *sandboxContainer) Checkpoint(ctx context.Context, dir string) error {
	if err := c.r.checkpointWorks(ctx); err != nil {
		return err
	}
	return c.save(dir)
}

// save is runsc checkpoint, the image's pages then dropped.
func (c *sandboxContainer) save(dir string) error {
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
	n := &sandboxContainer{r: c.r, id: c.id, bundle: c.bundle, cg: c.cg, done: make(chan struct{}), restoredAs: c.restoredAs}
	if err := n.start("restore", "--image-path", dir, "--bundle", c.bundle, c.id); err != nil {
		return nil, err
	}
	return n, nil
}

// checkpointWorks probes, once per backend, that a sandbox can be
// checkpointed and restored here, on the backend's platform: a checkpoint
// that fails ends its sandbox, and a restore that fails leaves it paused,
// so the first sandbox paused on a host is not the one to find out. A
// failure is kept for cpRetry (it may have been the host's load), then
// probed again.
func (r *Runtime) checkpointWorks(ctx context.Context) error {
	r.cpMu.Lock()
	defer r.cpMu.Unlock()
	if !r.cpProbed.IsZero() && (r.cpErr == nil || time.Since(r.cpProbed) < cpRetry) {
		return r.cpErr
	}
	r.cpErr = nil
	timeout := r.cfg.ProbeTimeout
	if timeout <= 0 {
		timeout = DefaultProbeTimeout
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*timeout)
	defer cancel()
	start := time.Now()
	if err := r.probeCheckpoint(pctx); err != nil {
		r.cpErr = fmt.Errorf("%w: runsc could not checkpoint and restore a sandbox on this host with the platform %s: %v",
			sandbox.ErrUnsupported, r.cfg.Platform, err)
	}
	r.cpProbed = time.Now()
	r.cfg.Logger.Info("gvisor: checkpoint probe", "platform", r.cfg.Platform, "ms", time.Since(start).Milliseconds(),
		"err", r.cpErr)
	return r.cpErr
}

// probeCheckpoint starts a sandbox as every sandbox is started, its agent
// waiting for its configuration; checkpoints it; restores it; and gives
// the restored agent a frame that is not a configuration, which it
// answers with the error that says so (the platform probe's proof):
// the restored sandbox runs and is reached through the restore's stdio.
// Whatever happens, what it started is removed before it returns.
func (r *Runtime) probeCheckpoint(ctx context.Context) error {
	dir, l, done, err := r.probeLaunch()
	if err != nil {
		return err
	}
	defer done()
	end := func(c container.Container) {
		c.Kill()
		select {
		case <-c.Done():
		case <-time.After(5 * time.Second):
		}
		c.Stdin().Close()
		c.Remove()
	}
	first, err := r.Launch(ctx, l)
	if err != nil {
		return err
	}
	defer end(first)
	c := first.(*sandboxContainer)
	// runsc run returns at once: its container is there once runsc
	// says it runs.
	for {
		out, _ := exec.CommandContext(ctx, r.cfg.Runsc, append(r.globalArgs(), "state", c.id)...).Output()
		var st struct{ Status string }
		if json.Unmarshal(out, &st) == nil && st.Status == "running" {
			break
		}
		select {
		case <-c.Done():
			return fmt.Errorf("the sandbox ended: runsc: %s", c.WhyEnded())
		case <-ctx.Done():
			return fmt.Errorf("the sandbox did not start: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	images := filepath.Join(dir, "checkpoint")
	if err := os.Mkdir(images, 0o700); err != nil {
		return err
	}
	// The agent waits for its configuration as soon as it runs; the
	// checkpoint may come before: the sandbox is saved wherever it is.
	if err := c.save(images); err != nil {
		return err
	}
	// runsc ends a sandbox it has saved. Seen once on a loaded CI
	// machine: the saved sandbox's `runsc run` had not ended 30 s later.
	// The image is whole once `runsc checkpoint` returns, so the probe
	// then ends the sandbox itself, as a pause does (container.session's
	// end), rather than fail the host for a slow exit.
	select {
	case <-c.Done():
	case <-time.After(savedEndWait):
		r.cfg.Logger.Warn("gvisor: checkpoint probe: the saved sandbox did not end; killing it",
			"after", savedEndWait, "runsc", lastLine(c.log.String()))
		c.Kill()
		select {
		case <-c.Done():
		case <-ctx.Done():
			return fmt.Errorf("the checkpointed sandbox did not end, even killed: %w", ctx.Err())
		}
	case <-ctx.Done():
		return fmt.Errorf("the checkpointed sandbox did not end: %w", ctx.Err())
	}
	c.Remove()
	restored, err := c.Restore(ctx, images)
	if err != nil {
		return err
	}
	defer end(restored)
	answered := make(chan error, 1)
	go func() { answered <- readProbeAnswer(restored.Stdout()) }()
	if err := agent.NewWriter(restored.Stdin()).Ctl(agent.Ctl{Op: agent.OpPing}); err != nil {
		return fmt.Errorf("write to the restored sandbox: %w", err)
	}
	select {
	case err := <-answered:
		if err != nil {
			if why := restored.(*sandboxContainer).WhyEnded(); why != "" {
				return fmt.Errorf("runsc: %s", why)
			}
		}
		return err
	case <-ctx.Done():
		return fmt.Errorf("the restored sandbox did not answer: %w", ctx.Err())
	}
}

// savedEndWait is how long the checkpoint probe waits for a saved sandbox
// to end by itself before it kills it.
const savedEndWait = 5 * time.Second

// cpRetry is how long a failed checkpoint probe is believed.
const cpRetry = 5 * time.Minute

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
