// Package bench measures how long it takes to run a piece of Python in a
// sandbox, for Vivarium and for its peers (python3 alone, bubblewrap,
// gVisor, Docker, Jupyter kernels), in one run on one machine, and reports
// each peer as a ratio to Vivarium.
//
// The engine (Subject, Run, Report) knows nothing of what it measures: a row
// of the report is a Subject whose Run function does one iteration of a
// workload and checks its outcome. Rows are grouped by workload; within a
// workload, one row is the Reference (Vivarium's) and every other row's
// ratio is its median over the reference's median. The subjects the
// `vivarium bench` command measures are built by Subjects (subjects_linux.go).
//
// Iterations run one after the other, never overlapping, so that latency
// rows do not compete for the machine's cores; throughput rows
// (Options.Concurrency) are the only place where iterations overlap. The
// rows of a workload are measured in rounds, each round one iteration of
// every row in turn, so that a change in the machine's load during the run
// weighs on every row of the workload alike instead of on whichever row was
// running then: ratios stay meaningful on a machine that is not quiet.
package bench

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"time"
)

// A Subject is one row of the report: something that runs one iteration of
// a workload.
type Subject struct {
	// Workload names the work every row of a group does ("W1 print(1)").
	// Ratios are only taken within a workload.
	Workload string
	// Name identifies the row within its workload.
	Name string
	// Reference marks the row the others of its workload are compared with.
	// A workload has at most one.
	Reference bool
	// Peer marks rows that are not Vivarium: they never change the exit
	// status of the bench, whatever happens to them.
	Peer bool
	// Optional marks Vivarium rows of a backend a host may lack (gvisor,
	// docker, wasm): skipped there, they do not change the exit status;
	// when they run, their errors do.
	Optional bool
	// Skip, when not empty, says why the subject cannot run on this host
	// (and what to install); the row is printed with the reason.
	Skip string
	// Setup, if set, runs once before the first iteration and is not
	// timed. An error fails the row and skips its iterations. It bounds its
	// own duration.
	Setup func(ctx context.Context) error
	// Run does one iteration and checks its outcome: an iteration that
	// printed the wrong thing is an error, not a fast run. It must be safe
	// for concurrent use, as throughput rows call it from several
	// goroutines at once. The row is the iterations' latency.
	Run func(ctx context.Context) error
	// Ready, if set, runs before each latency iteration and is not timed:
	// it waits until what the row draws on is ready again (a pool
	// refilled, the last sandbox torn down), so that the row measures
	// what a request finds when requests are spaced out. An error counts
	// as the iteration's. Throughput runs never call it: there, the
	// refill is part of what is measured.
	Ready func(ctx context.Context) error
	// Unit, when set, makes a value row: instead of Run, each iteration
	// calls Measure, which returns a quantity in Unit that is not its own
	// duration (memory per idle sandbox, say). Value rows are printed
	// apart and get no throughput measurement.
	Unit    string
	Measure func(ctx context.Context) (float64, error)
	// Iterations, when > 0, caps the row's measured iterations below
	// Options.Iterations, and the row runs no warm-up: for rows whose
	// every iteration is costly (hundreds of sandboxes made) and whose
	// value does not depend on a warm cache. Such rows take part in the
	// first rounds after the warm-up ones.
	Iterations int
	// Note, if set, is called after the last iteration: what the row's
	// value means that its name cannot say (which bound a projection
	// hit), printed under it.
	Note func() string
	// Teardown, if set, runs after the last iteration, also when Setup
	// failed.
	Teardown func() error
}

// key is what Options.Only is matched against.
func (s *Subject) key() string { return s.Workload + " / " + s.Name }

// Options say how much to measure.
type Options struct {
	// Iterations is the number of measured iterations per row (at least 1).
	Iterations int
	// WarmUp iterations run before the measured ones and are not counted:
	// they fill the page cache and start what a subject starts lazily.
	WarmUp int
	// Only selects rows whose "WORKLOAD / NAME" matches; nil selects all.
	// The reference row of a selected row's workload always runs, so that
	// ratios can be taken.
	Only *regexp.Regexp
	// Concurrency > 0 adds a throughput measurement to every row:
	// Concurrency clients run iterations back to back for Duration.
	Concurrency int
	Duration    time.Duration
	// Timeout bounds one iteration; default 2 minutes.
	Timeout time.Duration
	// MaxConsecutiveErrors ends a row early after that many failed
	// iterations in a row (a broken peer should not cost Iterations
	// timeouts); default 3.
	MaxConsecutiveErrors int
	// Progress, if set, receives a line per row as it is measured.
	Progress io.Writer
	// Now gives the report's date; default time.Now.
	Now func() time.Time
}

func (o Options) withDefaults() Options {
	if o.Iterations < 1 {
		o.Iterations = 1
	}
	if o.WarmUp < 0 {
		o.WarmUp = 0
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Minute
	}
	if o.MaxConsecutiveErrors <= 0 {
		o.MaxConsecutiveErrors = 3
	}
	if o.Concurrency > 0 && o.Duration <= 0 {
		o.Duration = 10 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Run measures the selected subjects, a workload at a time in the order
// the workloads first appear, and returns the report. It never fails: a
// subject that cannot run is a row that says so. When ctx is cancelled,
// rows not yet measured are marked as skipped.
func Run(ctx context.Context, subjects []Subject, opts Options) *Report {
	opts = opts.withDefaults()
	rep := &Report{
		Date:        opts.Now().Format("2006-01-02"),
		Iterations:  opts.Iterations,
		WarmUp:      opts.WarmUp,
		Concurrency: opts.Concurrency,
		Duration:    Millis(opts.Duration),
	}
	sel := selected(subjects, opts.Only)
	for _, wl := range workloads(sel, func(s Subject) string { return s.Workload }) {
		var group []Subject
		for _, s := range sel {
			if s.Workload == wl {
				group = append(group, s)
			}
		}
		start := time.Now()
		rows, tps := measureWorkload(ctx, group, opts)
		for i, row := range rows {
			if group[i].Unit != "" {
				rep.Values = append(rep.Values, row)
			} else {
				rep.Latency = append(rep.Latency, row)
			}
			if tps[i] != nil {
				rep.Throughput = append(rep.Throughput, *tps[i])
			}
			if opts.Progress != nil {
				fmt.Fprintln(opts.Progress, progressLine(row, tps[i]))
			}
		}
		if opts.Progress != nil {
			fmt.Fprintf(opts.Progress, "%s: %s\n", wl, time.Since(start).Round(100*time.Millisecond))
		}
	}
	rep.computeRatios()
	return rep
}

// selected keeps the subjects only matches, and the reference rows of
// their workloads.
func selected(subjects []Subject, only *regexp.Regexp) []Subject {
	if only == nil {
		return subjects
	}
	wanted := map[string]bool{}
	for i := range subjects {
		if only.MatchString(subjects[i].key()) {
			wanted[subjects[i].Workload] = true
		}
	}
	var out []Subject
	for i := range subjects {
		s := &subjects[i]
		if only.MatchString(s.key()) || (s.Reference && wanted[s.Workload]) {
			out = append(out, *s)
		}
	}
	return out
}

// subjectRun is a subject being measured.
type subjectRun struct {
	s           Subject
	row         Row
	values      []float64
	consecutive int  // failed iterations in a row
	setUp       bool // Setup ran (or there was none): Teardown is due
	active      bool // iterations still run
}

// measureWorkload measures the subjects of one workload: every Setup, then
// the warm-up and measured iterations in rounds, then the throughput runs
// one row at a time, then every Teardown.
func measureWorkload(ctx context.Context, group []Subject, opts Options) ([]Row, []*ThroughputRow) {
	runs := make([]*subjectRun, len(group))
	for i, s := range group {
		r := &subjectRun{s: s, row: Row{Workload: s.Workload, Subject: s.Name, Peer: s.Peer, Optional: s.Optional, Reference: s.Reference, Unit: "ms"}}
		if s.Unit != "" {
			r.row.Unit = s.Unit
		}
		runs[i] = r
		switch {
		case s.Skip != "":
			r.row.Skipped = s.Skip
		case ctx.Err() != nil:
			r.row.Skipped = "interrupted"
		case s.Setup == nil:
			r.setUp, r.active = true, true
		default:
			// No timeout of the bench's: a setup may build an image.
			r.setUp = true
			if err := s.Setup(ctx); err != nil {
				r.row.Failed = true
				r.row.FirstError = "setup: " + err.Error()
			} else {
				r.active = true
			}
		}
	}

	for i := 0; i < opts.WarmUp+opts.Iterations; i++ {
		for _, r := range runs {
			if !r.active || ctx.Err() != nil || !r.s.inRound(i, opts) {
				continue
			}
			v, err := iterate(ctx, r.s, opts)
			if err != nil {
				r.consecutive++
				if r.row.FirstError == "" {
					r.row.FirstError = err.Error()
				}
				if i >= opts.WarmUp {
					r.row.Errors++
				}
				if r.consecutive >= opts.MaxConsecutiveErrors {
					r.active = false
				}
				continue
			}
			r.consecutive = 0
			if i >= opts.WarmUp {
				r.values = append(r.values, v)
			}
		}
	}

	tps := make([]*ThroughputRow, len(runs))
	for i, r := range runs {
		if !r.setUp || r.row.Failed {
			continue
		}
		r.row.Stats = Summarize(r.values)
		if r.row.N == 0 {
			r.row.Failed = true
			if r.row.FirstError == "" {
				r.row.FirstError = "interrupted"
			}
			continue
		}
		if opts.Concurrency > 0 && r.s.Unit == "" && ctx.Err() == nil {
			tp := throughput(ctx, r.s, opts)
			tps[i] = &tp
		}
	}

	rows := make([]Row, len(runs))
	for i, r := range runs {
		if len(r.values) > 0 && r.s.Note != nil {
			r.row.Note = r.s.Note()
		}
		if r.setUp && r.s.Teardown != nil {
			if err := r.s.Teardown(); err != nil && r.row.FirstError == "" {
				r.row.FirstError = "teardown: " + err.Error()
			}
		}
		rows[i] = r.row
	}
	return rows, tps
}

// inRound says whether s runs an iteration in round i (warm-up rounds
// first).
func (s *Subject) inRound(i int, opts Options) bool {
	if s.Iterations <= 0 {
		return true
	}
	return i >= opts.WarmUp && i-opts.WarmUp < s.Iterations
}

// iterate runs one iteration of s: its duration in milliseconds for a
// latency row, the value Measure returns for a value row.
func iterate(ctx context.Context, s Subject, opts Options) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	if s.Unit != "" {
		return s.Measure(ctx)
	}
	if s.Ready != nil {
		if err := s.Ready(ctx); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	err := s.Run(ctx)
	return toMillis(time.Since(start)), err
}

func progressLine(row Row, tp *ThroughputRow) string {
	head := row.Workload + " / " + row.Subject + ": "
	switch {
	case row.Skipped != "":
		return head + "skipped: " + row.Skipped
	case row.Failed:
		return head + "failed: " + row.FirstError
	}
	line := fmt.Sprintf("%sp50 %s, p95 %s over %d runs", head, formatValue(row.P50, row.Unit), formatValue(row.P95, row.Unit), row.N)
	if row.Errors > 0 {
		line += fmt.Sprintf(", %d errors (first: %s)", row.Errors, row.FirstError)
	}
	if row.Note != "" {
		line += "; " + row.Note
	}
	if tp != nil {
		line += fmt.Sprintf("; %.1f executions/s with %d clients, %d errors", tp.PerSecond, tp.Clients, tp.Errors)
	}
	return line
}
