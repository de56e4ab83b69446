package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// W7 is pausing and resuming a live sandbox (issue 15), against the cold
// start a user without pause would pay: a new sandbox that imports pandas
// again.
var W7 = Workload{ID: "W7", Title: "pause, and resume, an idle sandbox that imported pandas (native, forked from the zygote, CRIU)",
	Code: "import pandas as pd\ndf = pd.DataFrame({'a': range(1000)})\nprint(int(df.a.sum()))", Want: "499500"}

// pausing is the one sandbox W7's rows pause and resume in turn.
type pausing struct {
	b    sandbox.Backend
	mu   sync.Mutex
	sb   sandbox.Sandbox
	p    sandbox.Pauser
	snap string // a snapshot of sb, made once for fromSnapshot
}

func (ps *pausing) setup(ctx context.Context) error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.sb != nil {
		return nil
	}
	sb, err := ps.b.Create(ctx, sandbox.Spec{Pausable: true})
	if err != nil {
		return err
	}
	p, ok := sb.(sandbox.Pauser)
	if !ok {
		sb.Close()
		return errors.New("the backend's sandboxes cannot be paused")
	}
	if err := p.PauseSupported(); err != nil {
		sb.Close()
		return err
	}
	if err := checkRun(ctx, sb, W7.Code, W7.Want); err != nil {
		sb.Close()
		return err
	}
	ps.sb, ps.p = sb, p
	return nil
}

func (ps *pausing) teardown() error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.sb != nil {
		ps.sb.Close()
		ps.sb = nil
	}
	if ps.snap != "" {
		os.RemoveAll(filepath.Dir(ps.snap))
		ps.snap = ""
	}
	return nil
}

// pause times a pause of the running sandbox.
func (ps *pausing) pause(ctx context.Context) (float64, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.p.Paused() {
		if err := ps.p.Resume(ctx); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	if err := ps.p.Pause(ctx); err != nil {
		return 0, err
	}
	return ms(time.Since(start)), nil
}

// resume times a resume of the paused sandbox, then checks that its
// DataFrame is still there (not timed).
func (ps *pausing) resume(ctx context.Context) (float64, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if !ps.p.Paused() {
		if err := ps.p.Pause(ctx); err != nil {
			return 0, err
		}
	}
	return ps.timedResume(ctx)
}

// timedResume times a resume of the paused sandbox, then checks that its
// DataFrame is still there (not timed). Callers hold mu.
func (ps *pausing) timedResume(ctx context.Context) (float64, error) {
	start := time.Now()
	if err := ps.p.Resume(ctx); err != nil {
		return 0, err
	}
	d := time.Since(start)
	if err := checkRun(ctx, ps.sb, "print(int(df.a.sum()))", W7.Want); err != nil {
		return 0, fmt.Errorf("after the resume: %w", err)
	}
	return ms(d), nil
}

// pausedMemory is what the paused sandbox's cgroup still holds: its files
// (the root's tmpfs), no process.
func (ps *pausing) pausedMemory(ctx context.Context) (float64, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if !ps.p.Paused() {
		if err := ps.p.Pause(ctx); err != nil {
			return 0, err
		}
	}
	u, ok := ps.sb.(sandbox.UsageReporter)
	if !ok {
		return 0, errors.New("the sandbox reports no usage")
	}
	st, err := u.Usage()
	if err != nil {
		return 0, err
	}
	return float64(st.Memory) / (1 << 20), nil
}

// fork10 times a fork of the running sandbox into ten copies, all ready
// for code (the goal: one second), and closes them, untimed.
func (ps *pausing) fork10(ctx context.Context) (float64, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.p.Paused() {
		if err := ps.p.Resume(ctx); err != nil {
			return 0, err
		}
	}
	f, ok := ps.sb.(sandbox.Forker)
	if !ok {
		return 0, errors.New("the backend's sandboxes cannot be forked")
	}
	start := time.Now()
	copies, err := f.Fork(ctx, 10, sandbox.ForkOptions{})
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	defer func() {
		for _, c := range copies {
			go c.Close()
		}
	}()
	if err := checkRun(ctx, copies[9], "print(int(df.a.sum()))", W7.Want); err != nil {
		return 0, fmt.Errorf("a copy: %w", err)
	}
	return ms(d), nil
}

// running resumes the sandbox if it is paused. Callers hold mu.
func (ps *pausing) running(ctx context.Context) error {
	if ps.p.Paused() {
		return ps.p.Resume(ctx)
	}
	return nil
}

// saveSnapshot saves the running sandbox as a snapshot in a new
// temporary directory, and returns the snapshot's path.
func (ps *pausing) saveSnapshot(ctx context.Context) (string, time.Duration, error) {
	sn, ok := ps.sb.(sandbox.Snapshotter)
	if !ok {
		return "", 0, errors.New("the backend's sandboxes cannot be saved as snapshots")
	}
	dir, err := os.MkdirTemp("", "vivarium-bench-snapshot-")
	if err != nil {
		return "", 0, err
	}
	start := time.Now()
	_, err = sn.SaveSnapshot(ctx, filepath.Join(dir, "s"))
	d := time.Since(start)
	if err != nil {
		os.RemoveAll(dir)
		return "", 0, err
	}
	return filepath.Join(dir, "s"), d, nil
}

// snapshotSave times saving the running sandbox as a snapshot on disk,
// then removes it (untimed).
func (ps *pausing) snapshotSave(ctx context.Context) (float64, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if err := ps.running(ctx); err != nil {
		return 0, err
	}
	p, d, err := ps.saveSnapshot(ctx)
	if err != nil {
		return 0, err
	}
	os.RemoveAll(filepath.Dir(p))
	return ms(d), nil
}

// fromSnapshot times a new sandbox made of a snapshot of the running
// sandbox (saved once), ready for code: its DataFrame is checked and it
// is closed, untimed.
func (ps *pausing) fromSnapshot(ctx context.Context) (float64, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.snap == "" {
		if err := ps.running(ctx); err != nil {
			return 0, err
		}
		p, _, err := ps.saveSnapshot(ctx)
		if err != nil {
			return 0, err
		}
		ps.snap = p
	}
	r, ok := sandbox.BackendAs[sandbox.SnapshotRestorer](ps.b, "")
	if !ok {
		return 0, errors.New("the backend cannot make sandboxes from snapshots")
	}
	start := time.Now()
	sb, err := r.CreateFromSnapshot(ctx, ps.snap, sandbox.FromSnapshot{})
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	defer func() { go sb.Close() }()
	if err := checkRun(ctx, sb, "print(int(df.a.sum()))", W7.Want); err != nil {
		return 0, fmt.Errorf("a sandbox of the snapshot: %w", err)
	}
	return ms(d), nil
}

// keepOnDisk pauses the running sandbox, writes it down as the service
// does 5 s after a pause (PausePersister) and releases it
// (PausedReleaser), and returns the directory it is kept in and the
// bytes it takes there. Callers hold mu.
func (ps *pausing) keepOnDisk(ctx context.Context) (string, int64, error) {
	if ps.p.Paused() {
		if err := ps.p.Resume(ctx); err != nil {
			return "", 0, err
		}
	}
	pp, ok := ps.sb.(sandbox.PausePersister)
	r, ok2 := ps.sb.(sandbox.PausedReleaser)
	if !ok || !ok2 {
		return "", 0, errors.New("the backend's paused sandboxes cannot be kept on disk")
	}
	if err := ps.p.Pause(ctx); err != nil {
		return "", 0, err
	}
	dir, err := os.MkdirTemp("", "vivarium-bench-paused-")
	if err != nil {
		return "", 0, err
	}
	size, err := pp.PersistPaused(ctx, filepath.Join(dir, "p"))
	if err == nil {
		err = r.ReleasePaused(filepath.Join(dir, "p"))
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", 0, err
	}
	return dir, size, nil
}

// resumeFromDisk times the resume of a paused sandbox kept on disk and
// released (keepOnDisk, untimed), then checks that its DataFrame is
// still there (not timed).
func (ps *pausing) resumeFromDisk(ctx context.Context) (float64, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	dir, _, err := ps.keepOnDisk(ctx)
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	return ps.timedResume(ctx)
}

// keptSize is the disk a paused sandbox kept on disk takes, once
// released: all it holds.
func (ps *pausing) keptSize(ctx context.Context) (float64, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	dir, size, err := ps.keepOnDisk(ctx)
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	return float64(size) / (1 << 20), ps.p.Resume(ctx)
}

// coldStart is what a resume replaces: a new sandbox that runs the code
// again.
func coldStart(b sandbox.Backend) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		sb, err := b.Create(ctx, sandbox.Spec{Pausable: true})
		if err != nil {
			return err
		}
		defer func() { go sb.Close() }()
		return checkRun(ctx, sb, W7.Code, W7.Want)
	}
}

func checkRun(ctx context.Context, sb sandbox.Sandbox, code, want string) error {
	res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: code}, nil)
	if err != nil {
		return err
	}
	if res.Status != sandbox.StatusOK || !strings.Contains(res.Stdout, want) {
		return fmt.Errorf("%s: stdout %q, stderr %q", res.Status, res.Stdout, res.Stderr)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// pauseSubjects are W7's rows, run on b, a native backend whose sandboxes
// can be paused.
func pauseSubjects(b sandbox.Backend, skip string) []Subject {
	if b == nil && skip == "" {
		skip = "no native backend that pauses"
	}
	ps := &pausing{b: b}
	w := W7.Label()
	return []Subject{
		{Workload: w, Name: "vivarium resume (in-process)", Reference: true, Unit: "ms", Skip: skip,
			Setup: ps.setup, Measure: ps.resume, Teardown: ps.teardown},
		{Workload: w, Name: "vivarium pause (in-process)", Unit: "ms", Skip: skip, Setup: ps.setup, Measure: ps.pause,
			Teardown: ps.teardown},
		{Workload: w, Name: "cold start instead: a new sandbox runs the code again (in-process, no pool: a fork of the zygote)", Unit: "ms",
			Skip: skip, Measure: func(ctx context.Context) (float64, error) {
				start := time.Now()
				err := coldStart(b)(ctx)
				return ms(time.Since(start)), err
			}},
		{Workload: w, Name: "vivarium fork into 10 copies, all ready (in-process)", Unit: "ms", Skip: skip,
			Setup: ps.setup, Measure: ps.fork10, Teardown: ps.teardown},
		{Workload: w, Name: "vivarium snapshot saved to disk, the sandbox going on (in-process)", Unit: "ms", Skip: skip,
			Setup: ps.setup, Measure: ps.snapshotSave, Teardown: ps.teardown},
		{Workload: w, Name: "a new sandbox of that snapshot, ready (in-process, no signature check)", Unit: "ms", Skip: skip,
			Setup: ps.setup, Measure: ps.fromSnapshot, Teardown: ps.teardown},
		{Workload: w, Name: "memory the paused sandbox keeps (its files' tmpfs)", Unit: "MiB", Skip: skip,
			Setup: ps.setup, Measure: ps.pausedMemory, Teardown: ps.teardown},
		{Workload: w, Name: "resume of a paused sandbox kept on disk, released (in-process, no signature check)", Unit: "ms",
			Skip: skip, Setup: ps.setup, Measure: ps.resumeFromDisk, Teardown: ps.teardown},
		{Workload: w, Name: "disk a paused sandbox kept on disk takes, released: all it holds (no memory)", Unit: "MiB",
			Skip: skip, Setup: ps.setup, Measure: ps.keptSize, Teardown: ps.teardown},
	}
}
