package container

// Pause and resume (sandbox.Pauser, issue 15, docs/snapshots.md), for
// runtimes whose containers are Checkpointers (gVisor's runsc). Pause has
// the runtime save the container (every process's memory and open files,
// the agent and the runner waiting for their next frame) into a directory
// of the backend's, and the container ends: its memory is freed. Resume
// has the runtime start a container from it, on the same disk and cgroup,
// and gives the same Sandbox its agent, reached through the new
// container's standard input and output, and its runner, ready and
// holding the old state. The sandbox keeps its id, cgroup, host user and
// files throughout; its workspace can be read and written while paused.
//
// Order of a pause, under pauseMu and the core's Exclusive (no execution
// runs or starts):
//  1. no command may be starting or running (startGate), then paused;
//  2. the checkpoint must fit on the checkpoint directory's disk (a
//     runtime may end a container whose checkpoint failed), and its
//     restore in the sandbox's memory limit;
//  3. a ping: the agent has read every frame sent before (the bytes
//     still in the old standard input's pipe would not be in the
//     checkpoint);
//  4. the checkpoint; the container's end is seen by the reader of its
//     stream, and its runner is kept (runnerKept), not taken for lost.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/agent"
	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/core"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

var _ sandbox.Pauser = (*Sandbox)(nil)

// Bounds of the steps of a pause and a resume.
const (
	// pingTimeout bounds the agent's answer to a ping before a
	// checkpoint: it reads its stream all the time, and is idle.
	pingTimeout = 10 * time.Second
	// restoreTimeout bounds a restored agent's first answer: the runtime
	// loads the whole checkpoint first (seconds for a big one on a busy
	// host).
	restoreTimeout = time.Minute
	// drainTimeout bounds the wait for the end of a checkpointed
	// container's stream.
	drainTimeout = 30 * time.Second
	// checkpointMargin is room a checkpoint's directory must have beyond
	// the sandbox's memory.
	checkpointMargin = 64 << 20
)

// PauseSupported implements sandbox.Pauser.
func (s *Sandbox) PauseSupported() error {
	if s.spec.OneShot {
		return fmt.Errorf("%w: a one-shot sandbox cannot be paused", sandbox.ErrUnsupported)
	}
	ss := s.session()
	if ss == nil {
		return sandbox.ErrClosed
	}
	if _, ok := ss.c.(noContainer); ok {
		return nil // opened paused from disk (OpenPaused): its resume makes it a container
	}
	cp, ok := ss.c.(Checkpointer)
	if !ok {
		return fmt.Errorf("%w: sandboxes of the %s backend cannot be paused (its containers cannot be checkpointed yet)",
			sandbox.ErrUnsupported, s.b.Name())
	}
	if s.b.cfg.CheckpointDir == "" {
		return fmt.Errorf("%w: the %s backend has no checkpoint directory to pause sandboxes to", sandbox.ErrUnsupported,
			s.b.Name())
	}
	return cp.CheckpointSupported()
}

// Pause implements sandbox.Pauser. It fails with sandbox.ErrBusy while an
// execution or a command runs, and with sandbox.ErrUnsupported, naming
// why, for a sandbox that cannot be paused or whose checkpoint would not
// fit on the disk. A pause that fails leaves the sandbox running: in the
// same container, or, where the runtime ended the container with its
// failed checkpoint, in a new one with the same files (its Python state
// lost, which the error and the next execution say). Pausing a paused
// sandbox does nothing.
func (s *Sandbox) Pause(ctx context.Context) error {
	if err := s.PauseSupported(); err != nil {
		return err
	}
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	if s.closing.Load() {
		return sandbox.ErrClosed
	}
	if s.Core.Paused() {
		return nil
	}
	return s.Exclusive(func() error {
		// A container that died while idle (a command over the memory
		// limit) is replaced first, as an execution would replace it.
		if err := (*driver)(s).Prepare(ctx); err != nil {
			return err
		}
		s.startGate.Lock()
		if n := s.commandsRunning(); n > 0 {
			s.startGate.Unlock()
			return fmt.Errorf("%w: %d command(s) started in the sandbox still run; wait for them or kill them before pausing",
				sandbox.ErrBusy, n)
		}
		s.Core.SetPaused(true)
		s.startGate.Unlock()
		if err := s.checkpointContainer(ctx); err != nil {
			s.Core.SetPaused(false)
			return fmt.Errorf("pause: %w", err)
		}
		return nil
	})
}

// commandsRunning counts the commands started with Start that are
// starting or running: their streams go through the agent's to this
// Sandbox, and do not follow a checkpoint yet. (One that has exited has
// had its output flushed before its exit was told; only the ends of its
// streams may still come, and they do before the checkpointed container's
// stream ends.)
func (s *Sandbox) commandsRunning() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, cs := range s.cmds {
		if !cs.exited {
			n++
		}
	}
	return n
}

// checkpointContainer saves the sandbox's container into a new checkpoint
// directory and waits for its end. On failure the directory is removed
// and the sandbox runs (in a new container if the runtime ended the old).
func (s *Sandbox) checkpointContainer(ctx context.Context) error {
	dir, err := s.newCheckpointDir()
	if err != nil {
		return err
	}
	if err := s.saveContainer(ctx, dir); err != nil {
		os.RemoveAll(dir)
		return err
	}
	s.checkpoint = dir
	return nil
}

// saveContainer saves the sandbox's container into dir, an empty
// directory, and waits for its end. On failure the sandbox runs (in a new
// container if the runtime ended the old); what dir holds is the
// caller's to remove.
func (s *Sandbox) saveContainer(ctx context.Context, dir string) error {
	ss := s.session()
	cp := ss.c.(Checkpointer)
	if err := s.checkpointFits(cp, dir); err != nil {
		return err
	}
	// The sandbox's connections to its proxy end before the ping: the
	// proxy's side of them would not be in the checkpoint.
	if s.spec.Egress != nil {
		ss.out.Ctl(agent.Ctl{Op: agent.OpEgressReset})
	}
	if err := s.ping(ctx, ss, pingTimeout); err != nil {
		return fmt.Errorf("the agent did not answer before the checkpoint: %w", err)
	}
	ss.endEgress(false)
	ss.runnerKept.Store(true)
	start := time.Now()
	// Not stopped half-way: a runtime's save is not undone by a caller
	// that gives up.
	err := cp.Checkpoint(context.WithoutCancel(ctx), dir)
	if errors.Is(err, sandbox.ErrUnsupported) {
		// Refused before anything was done to the container.
		ss.runnerKept.Store(false)
		if s.spec.Egress != nil {
			ss.out.Ctl(agent.Ctl{Op: agent.OpEgressRelease})
		}
		return err
	}
	if err != nil {
		if s.survived(ctx, ss) {
			ss.runnerKept.Store(false)
			if s.spec.Egress != nil {
				ss.out.Ctl(agent.Ctl{Op: agent.OpEgressRelease})
			}
			return err
		}
		if rerr := s.relaunch(context.WithoutCancel(ctx), true); rerr != nil {
			return fmt.Errorf("%w; the container ended with it, and a new one did not start: %v", err, rerr)
		}
		return fmt.Errorf("%w; the container ended with it: the sandbox runs again in a new one, with its files but not its Python state", err)
	}
	saved := time.Since(start)
	// Every frame the container sent before its end is handled; then
	// what the runtime keeps for it is removed (its checkpoint stays).
	select {
	case <-ss.ended:
	case <-time.After(drainTimeout):
		s.b.cfg.Logger.Warn("a checkpointed container's stream did not end", "id", s.id)
	}
	if err := ss.end(); err != nil {
		s.b.cfg.Logger.Warn("remove a checkpointed container", "id", s.id, "err", err)
	}
	s.b.cfg.Logger.Debug("sandbox checkpointed", "id", s.id, "checkpoint_ms", saved.Milliseconds(),
		"ms", time.Since(start).Milliseconds())
	return nil
}

// survived tells whether the container of ss runs on after a checkpoint
// that failed. runsc kills the sandbox's kernel once a save has begun,
// whatever its outcome, and a failure before that (runsc's own) leaves it
// running; how soon a killed sandbox ends is the host's load's to say
// (seconds, on a busy one). So the agent is asked: an answer says the
// container runs (a kernel killed on a failed save was killed before runsc
// told of the failure, and answers nothing), the end of its stream says it
// ended. A container that does neither within drainTimeout counts as ended
// (relaunch then removes it).
func (s *Sandbox) survived(ctx context.Context, ss *session) bool {
	if err := s.ping(context.WithoutCancel(ctx), ss, drainTimeout); err == nil {
		return true
	}
	// Every frame the ended container sent is handled before it is
	// replaced (its stream may still be draining if the ping could not be
	// sent).
	select {
	case <-ss.ended:
	case <-time.After(pingTimeout):
	}
	return false
}

// checkpointFits refuses a checkpoint that may not fit in dir's file
// system (a checkpoint holds at most the memory the sandbox's cgroup was
// ever charged: its peak; else its limit; and runsc ends a sandbox whose
// checkpoint could not be written), or whose restore would not fit in the
// sandbox's memory limit (what it holds now, and the runtime's overhead).
func (s *Sandbox) checkpointFits(cp Checkpointer, dir string) error {
	need := s.spec.Limits.Memory
	if cg := s.group(); cg != nil {
		st, err := cg.Stats()
		if err == nil && st.MemoryPeak > 0 && st.MemoryPeak < need {
			need = st.MemoryPeak
		}
		var now int64
		if m, ok := cg.(cgroups.MemoryReader); ok && err == nil {
			now, err = m.MemoryCurrent()
		}
		if over := cp.RestoreOverhead(); err == nil && over > 0 && now+over > s.spec.Limits.Memory {
			return fmt.Errorf("%w: the sandbox holds %d MiB of its %d MiB memory limit, and resuming it would take "+
				"about %d MiB more (the %s backend's restore): it could not be resumed; free memory in it first",
				sandbox.ErrUnsupported, now>>20, s.spec.Limits.Memory>>20, over>>20, s.b.Name())
		}
	}
	need += checkpointMargin
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return err
	}
	if free := int64(fs.Bavail) * fs.Bsize; free < need {
		return fmt.Errorf("%w: the host's checkpoint disk has %d MiB free, and this sandbox's checkpoint may take up to %d MiB",
			sandbox.ErrUnsupported, free>>20, need>>20)
	}
	return nil
}

// ping sends the agent of ss a ping and waits for its answer: every frame
// sent before it has been read, and the agent's stream reaches here.
func (s *Sandbox) ping(ctx context.Context, ss *session, timeout time.Duration) error {
	id := pingID.Add(1)
	if err := ss.out.Ctl(agent.Ctl{Op: agent.OpPing, ID: id}); err != nil {
		return fmt.Errorf("the agent is gone: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch err := ss.pongs.Wait(wctx, uint64(id), ss.ended); {
	case errors.Is(err, core.ErrGone):
		return errors.New("the container ended")
	case err != nil && ctx.Err() == nil:
		return fmt.Errorf("no answer within %v", timeout)
	default:
		return err
	}
}

var pingID atomic.Uint32

// Resume implements sandbox.Pauser: the sandbox's container is restored
// where it was. A resume that fails leaves the sandbox paused, its
// checkpoint kept. Resuming a sandbox that is not paused does nothing.
func (s *Sandbox) Resume(ctx context.Context) error {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	if s.closing.Load() {
		return sandbox.ErrClosed
	}
	if !s.Core.Paused() {
		return nil
	}
	if s.persisted != nil {
		return s.Exclusive(func() error {
			if err := s.resumePersisted(ctx); err != nil {
				return fmt.Errorf("resume: %w", err)
			}
			s.Core.SetPaused(false)
			return nil
		})
	}
	return s.Exclusive(func() error {
		if err := s.restoreContainer(ctx); err != nil {
			return fmt.Errorf("resume: %w", err)
		}
		if err := os.RemoveAll(s.checkpoint); err != nil {
			s.b.cfg.Logger.Warn("remove a resumed sandbox's checkpoint", "id", s.id, "err", err)
		}
		s.checkpoint = ""
		s.Core.SetPaused(false)
		return nil
	})
}

// restoreContainer starts the container from the checkpoint and makes it
// the sandbox's: its session, and its runner, the one that was saved (same
// generation, ready).
func (s *Sandbox) restoreContainer(ctx context.Context) error {
	s.mu.Lock()
	prev := s.runner
	s.mu.Unlock()
	if prev == nil {
		return errors.New("the paused sandbox had no runner")
	}
	c, err := s.session().c.(Checkpointer).Restore(ctx, s.checkpoint)
	if err != nil {
		return err
	}
	return s.adopt(ctx, c, prev.gen)
}

// adopt makes c, a container restored from a checkpoint (of this sandbox,
// or of the one a snapshot was saved from), the sandbox's: its session,
// and its runner, the saved one of generation gen, ready. Where its agent
// does not answer, c is ended and removed.
func (s *Sandbox) adopt(ctx context.Context, c Container, gen uint32) error {
	start := time.Now()
	ss := newSession(c)
	close(ss.ready) // it was, before the checkpoint
	ss.runnerKept.Store(true)
	go s.read(ss)
	if err := s.ping(ctx, ss, restoreTimeout); err != nil {
		ss.end()
		<-ss.ended
		// Kept, ended: what the runtime made for it goes with the
		// sandbox's Close, and a resume tried again restores in its
		// place.
		s.sess.Store(ss)
		why := ""
		if e, ok := c.(Explainer); ok {
			if w := e.WhyEnded(); w != "" {
				why = " (" + w + ")"
			}
		}
		return fmt.Errorf("the restored container's agent did not answer: %v%s", err, why)
	}
	s.b.cfg.Logger.Debug("sandbox restored", "id", s.id, "ms", time.Since(start).Milliseconds())
	if s.spec.Egress != nil {
		// Its agent has held its proxy's connections since the
		// checkpoint (saveContainer); a sandbox without a proxy keeps
		// them closed.
		ss.out.Ctl(agent.Ctl{Op: agent.OpEgressRelease})
	}
	pr, pw := io.Pipe()
	r := &agentRunner{ss: ss, gen: gen, events: pw}
	r.r = core.NewRunner(r)
	r.r.MarkReady()
	go s.ReadEvents(r.r, pr)
	s.mu.Lock()
	s.runner = r
	s.mu.Unlock()
	s.sess.Store(ss)
	ss.runnerKept.Store(false)
	s.SetRunner(r.r)
	return nil
}

// newCheckpointDir makes a new, empty directory for a checkpoint:
// CheckpointDir/ID/N, root's alone.
func (s *Sandbox) newCheckpointDir() (string, error) {
	root := s.b.cfg.CheckpointDir
	if err := os.MkdirAll(filepath.Dir(root), 0o711); err != nil {
		return "", err
	}
	for _, d := range []string{root, filepath.Join(root, s.id)} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return "", err
		}
	}
	s.checkpoints++
	dir := filepath.Join(root, s.id, strconv.Itoa(s.checkpoints))
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", err
	}
	return dir, nil
}

// removeCheckpoints removes what the sandbox's pauses left.
func (s *Sandbox) removeCheckpoints() error {
	if s.b.cfg.CheckpointDir == "" || s.id == "" {
		return nil
	}
	return os.RemoveAll(filepath.Join(s.b.cfg.CheckpointDir, s.id))
}
