package bench

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// ThroughputRow is a sustained-load measurement of one subject: Clients
// goroutines each run iterations back to back, for Duration.
type ThroughputRow struct {
	Workload  string  `json:"workload"`
	Subject   string  `json:"subject"`
	Peer      bool    `json:"peer"`
	Reference bool    `json:"reference"`
	Clients   int     `json:"clients"`
	Duration  Millis  `json:"duration_ms"` // from the start to the last iteration's end
	Completed int     `json:"completed"`   // successful iterations
	Errors    int     `json:"errors"`
	PerSecond float64 `json:"per_second"` // Completed over Duration
	// Ratio is PerSecond over the reference row's: 2 means twice as many
	// executions per second as Vivarium. Zero when there is no reference.
	Ratio      float64 `json:"ratio,omitempty"`
	FirstError string  `json:"first_error,omitempty"`
}

// throughput runs s from opts.Concurrency goroutines for opts.Duration. First every client runs
// one iteration that is not counted (subjects that keep a client each, such
// as a warm kernel, start it then). Then each client starts iterations until
// opts.Duration has passed; iterations started before the end are waited for and
// counted, and the rate is taken over the time until the last one ended.
func throughput(ctx context.Context, s Subject, opts Options) ThroughputRow {
	clients := opts.Concurrency
	row := ThroughputRow{Workload: s.Workload, Subject: s.Name, Peer: s.Peer, Reference: s.Reference, Clients: clients}
	var (
		completed, errs atomic.Int64
		firstErr        sync.Once
		wg              sync.WaitGroup
	)
	fail := func(err error) {
		errs.Add(1)
		firstErr.Do(func() { row.FirstError = err.Error() })
	}
	iteration := func() error {
		ictx, cancel := context.WithTimeout(ctx, opts.Timeout)
		defer cancel()
		return s.Run(ictx)
	}

	for range clients {
		wg.Go(func() { iteration() }) // warm-up: not counted
	}
	wg.Wait()

	start := time.Now()
	deadline := start.Add(opts.Duration)
	for range clients {
		wg.Go(func() {
			// A client that keeps failing stops, rather than spin on
			// errors for the rest of the run.
			consecutive := 0
			for time.Now().Before(deadline) && ctx.Err() == nil && consecutive < opts.MaxConsecutiveErrors {
				if err := iteration(); err != nil {
					fail(err)
					consecutive++
					continue
				}
				consecutive = 0
				completed.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	row.Duration = Millis(elapsed)
	row.Completed = int(completed.Load())
	row.Errors = int(errs.Load())
	if elapsed > 0 {
		row.PerSecond = float64(row.Completed) / elapsed.Seconds()
	}
	return row
}
