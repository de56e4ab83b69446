package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// W6 is fairness between API keys: how long a quiet key's one-shot takes
// while another key keeps a server busy.
var W6 = Workload{ID: "W6", Title: "a quiet key's one-shot print(1) (p50 of 10), alone and beside a busy key",
	Code: "print(1)", Want: "1\n"}

const (
	// busySandboxes is how many sandboxes the busy key runs.
	busySandboxes = 8
	// quietRuns is how many one-shots of the quiet key one iteration
	// times; its value is their median.
	quietRuns = 10
	// quietCap is the longest a quiet one-shot is waited for.
	quietCap = 5 * time.Second
)

// busyCode is what each of the busy key's sandboxes runs: a fork bomb
// whose every process spins, failing forks and looping, until the pids
// limit holds it (64 processes of CPU loops by default).
const busyCode = `
import os, time
end = time.monotonic() + 600
while time.monotonic() < end:
    try:
        os.fork()
    except OSError:
        pass
`

// fairness is a `vivarium serve` with two API keys, quiet and busy, and
// --tenant-share on or off.
type fairness struct {
	srv *server
}

func newFairness(bin string, share bool, uidBase int) *fairness {
	srv := newServer(bin)
	srv.parent = fmt.Sprintf("vivarium-bench-share-%v", share)
	srv.uidBase = uidBase
	srv.keys = []string{"quiet", "busy"}
	srv.extra = []string{fmt.Sprintf("--tenant-share=%v", share)}
	return &fairness{srv: srv}
}

// quietP50 is the median latency of the quiet key's one-shots, in
// milliseconds. A one-shot that takes longer than quietCap counts as
// quietCap: it is slow, not failed, and waiting for it would let one
// iteration run past the bench's limit.
func (f *fairness) quietP50(ctx context.Context) (float64, error) {
	var ms []float64
	for range quietRuns {
		start := time.Now()
		var res sandbox.Result
		one, cancel := context.WithTimeout(ctx, quietCap)
		err := f.srv.postAs(one, "quiet", "POST", "/v1/execute", map[string]any{"code": W6.Code}, &res)
		capped := errors.Is(one.Err(), context.DeadlineExceeded) && ctx.Err() == nil
		cancel()
		switch {
		case err != nil && capped:
			ms = append(ms, toMillis(quietCap))
			continue
		case err != nil:
			return 0, err
		}
		if err := checkResult(&res, W6.Want); err != nil {
			return 0, err
		}
		ms = append(ms, toMillis(time.Since(start)))
	}
	return Summarize(ms).P50, nil
}

// alone measures the quiet key with nothing else running.
func (f *fairness) alone(ctx context.Context) (float64, error) { return f.quietP50(ctx) }

// beside measures the quiet key while the busy key's sandboxes run their
// bombs. Making them, letting the load build and removing them is not
// timed.
func (f *fairness) beside(ctx context.Context) (float64, error) {
	busyCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	ids := make([]string, busySandboxes)
	defer func() {
		stop()
		var deletes sync.WaitGroup
		for _, id := range ids {
			if id != "" {
				deletes.Add(1)
				go func() {
					defer deletes.Done()
					f.srv.postAs(context.Background(), "busy", "DELETE", "/v1/sandboxes/"+id, nil, nil)
				}()
			}
		}
		deletes.Wait()
		wg.Wait()
	}()
	type made struct {
		id  string
		err error
	}
	results := make(chan made, busySandboxes)
	for range busySandboxes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var info struct{ ID string }
			if err := f.srv.postAs(busyCtx, "busy", "POST", "/v1/sandboxes", map[string]any{"timeout_s": 600}, &info); err != nil {
				results <- made{err: fmt.Errorf("busy key: %w", err)}
				return
			}
			results <- made{id: info.ID}
			// Ends when the sandbox is deleted.
			f.srv.postAs(busyCtx, "busy", "POST", "/v1/sandboxes/"+info.ID+"/execute",
				map[string]any{"code": busyCode, "timeout_s": 600}, nil)
		}()
	}
	var err error
	for i := range ids {
		r := <-results
		ids[i] = r.id
		err = cmp.Or(err, r.err)
	}
	if err != nil {
		return 0, err
	}
	// Until every bomb has filled its sandbox.
	select {
	case <-time.After(2 * time.Second):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return f.quietP50(ctx)
}

// fairnessSubjects are W6's rows: the quiet key alone and beside the busy
// key, on a server with --tenant-share (the reference: alone) and on one
// without.
func fairnessSubjects(bin, skip string) ([]Subject, func()) {
	on := newFairness(bin, true, 1_000_000_000+13<<24)
	off := newFairness(bin, false, 1_000_000_000+14<<24)
	setup := func(f *fairness) func(context.Context) error {
		return func(ctx context.Context) error { return f.srv.acquire(ctx) }
	}
	teardown := func(f *fairness) func() error { return f.srv.release }
	var out []Subject
	for _, r := range []struct {
		name    string
		f       *fairness
		measure func(*fairness) func(context.Context) (float64, error)
		ref     bool
	}{
		{"quiet key alone (--tenant-share)", on, func(f *fairness) func(context.Context) (float64, error) { return f.alone }, true},
		{fmt.Sprintf("beside a key of %d busy sandboxes (--tenant-share)", busySandboxes), on,
			func(f *fairness) func(context.Context) (float64, error) { return f.beside }, false},
		{"quiet key alone (--tenant-share=false)", off, func(f *fairness) func(context.Context) (float64, error) { return f.alone }, false},
		{fmt.Sprintf("beside a key of %d busy sandboxes (--tenant-share=false)", busySandboxes), off,
			func(f *fairness) func(context.Context) (float64, error) { return f.beside }, false},
	} {
		out = append(out, Subject{
			Workload: W6.Label(), Name: r.name, Reference: r.ref, Unit: "ms", Skip: skip,
			Setup: setup(r.f), Measure: r.measure(r.f), Teardown: teardown(r.f),
		})
	}
	return out, func() {
		for _, f := range []*fairness{on, off} {
			f.srv.mu.Lock()
			users := f.srv.users
			f.srv.users = 1
			f.srv.mu.Unlock()
			if users > 0 {
				f.srv.release()
			}
		}
	}
}
