package container

// Fork (sandbox.Forker, issue 15, docs/snapshots.md): a snapshot of the
// running sandbox (snapshot_linux.go: a checkpoint, its disk copied, the
// sandbox restored at once), in a directory of the backend's, made into n
// new sandboxes as RestoreSnapshot makes one, then removed. Each copy has
// its own id, state directory, cgroup (the source's limits), disk (its
// own copy of the files) and container; their random generators are
// reseeded unless asked not to be.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/hostmem"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

var _ sandbox.Forker = (*Sandbox)(nil)

// forkParallel is how many copies are restored at once: each restore is a
// runsc sandbox loading its image, CPU-bound.
const forkParallel = 4

// ForkSupported implements sandbox.Forker: what can be saved as a
// snapshot can be forked.
func (s *Sandbox) ForkSupported() error { return s.SnapshotSupported() }

// Fork implements sandbox.Forker. It fails as SaveSnapshot does (ErrBusy,
// ErrPaused), with ErrNoRoom where the copies would not fit in the host's
// memory; all copies are made, or none. The source goes on where it was,
// after a stop of about a pause and a resume.
func (s *Sandbox) Fork(ctx context.Context, n int, opts sandbox.ForkOptions) ([]sandbox.Sandbox, error) {
	if err := sandbox.CheckForkCount(n); err != nil {
		return nil, err
	}
	if err := s.ForkSupported(); err != nil {
		return nil, err
	}
	// Each copy holds what the source holds, and its restore more.
	if u, err := s.Usage(); err == nil {
		var over int64
		if cp, ok := s.session().c.(Checkpointer); ok {
			over = cp.RestoreOverhead()
		}
		if err := hostmem.Room(hostmem.Read, int64(n)*(u.Memory+over), "the copies"); err != nil {
			return nil, fmt.Errorf("fork into %d: %w", n, err)
		}
	}
	root := s.b.cfg.CheckpointDir
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(root, "fork-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	start := time.Now()
	snap := filepath.Join(tmp, "snapshot")
	if err := s.snapshot(ctx, snap); err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}
	saved := time.Since(start)
	copies, err := sandbox.Copies(n, forkParallel, func(i int) (sandbox.Sandbox, error) {
		from := sandbox.FromSnapshot{Tenant: s.spec.Tenant, SameRandomState: opts.SameRandomState}
		if i < len(opts.Egress) {
			from.Egress = opts.Egress[i] // the copy's own proxy, with the source's policy
		}
		return s.b.RestoreSnapshot(context.WithoutCancel(ctx), snap, from)
	})
	if err != nil {
		return nil, err
	}
	s.b.cfg.Logger.Debug("fork", "id", s.id, "copies", n, "snapshot_ms", saved.Milliseconds(),
		"ms", time.Since(start).Milliseconds())
	return copies, nil
}
