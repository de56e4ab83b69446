package core

import (
	"bytes"
	"errors"
	"io"
	"sync/atomic"

	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// ReadEvents follows runner r's event stream until it ends, then closes it.
// A malformed frame means the runner (or code writing to its stream) broke
// the protocol: parsing stops, the runner's requests are hung up (no result
// can be acknowledged any more: it ends after the current execution), and
// reading goes on so that nothing blocks.
func (c *Core) ReadEvents(r *Runner, events io.ReadCloser) {
	defer close(r.eventsDone)
	defer events.Close()
	fr := runner.NewFrameReader(events, MaxFrame)
	// Past the results cap, results are counted without being parsed; the
	// runner's own frames start exactly so (json.dumps of a dict whose
	// first key is "type").
	resultPrefix := []byte(`{"type": "result"`)
	var skipping atomic.Bool
	skip := func(body []byte) bool { return skipping.Load() && bytes.HasPrefix(body, resultPrefix) }
	for {
		ev, err := fr.NextSkipping(skip)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) {
				c.mu.Lock()
				r.broken = err
				c.mu.Unlock()
				r.conn.HangUp()
				io.Copy(io.Discard, events)
			}
			return
		}
		skipping.Store(c.Event(r, ev))
	}
}

// Event handles one event of runner r, in the order the runner wrote
// them. It reports whether the current execution has all the results it
// may keep (more can be skipped unparsed).
func (c *Core) Event(r *Runner, ev runner.Event) (full bool) {
	switch ev.Type {
	case "ready":
		r.MarkReady()
		return false
	case "setup_error":
		if r.onSetupError != nil {
			r.onSetupError(ev.Value)
			return false
		}
	case "result", "error":
		// What the code printed before this event was flushed before it;
		// deliver it first, so that streams see output and results in
		// the order they happened. For a result the runner waits for the
		// ack below, so nothing printed after it is delivered early.
		c.d.SyncOutput()
	}
	c.mu.Lock()
	var emit *sandbox.Output
	var rs sandbox.ResultSink
	if x := c.cur; x != nil && x.runner == r {
		emit = x.handle(ev)
		rs = x.resultSink
		full = len(x.results)+x.dropped >= maxResults
	}
	c.mu.Unlock()
	if emit != nil && rs != nil {
		rs.Result(*emit)
	}
	if ev.Type == "result" || ev.Type == "skipped" {
		// Every result is acknowledged, whoever it was for: the runner
		// (or a thread of the code) waits for it.
		r.conn.Ack()
	}
	return full
}

// Idle tells the core that runner r waits for its next request. A runner
// made with DoneOnIdle ends its execution so, after its "done".
func (c *Core) Idle(r *Runner) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if x := c.cur; x != nil && x.runner == r && x.sawDone && x.done != nil {
		close(x.done)
		x.done = nil
	}
}

// handle records an event; it returns a result to pass on to a sink.
// Called with Core.mu held.
func (x *execution) handle(ev runner.Event) *sandbox.Output {
	switch ev.Type {
	case "skipped":
		x.dropped++
	case "result":
		out, size := runner.Output(ev)
		size += resultOverhead
		if x.resultsBytes+size > maxResultsBytes || len(x.results) >= maxResults {
			x.dropped++
			return nil
		}
		x.resultsBytes += size
		x.results = append(x.results, out)
		return &out
	case "error":
		x.err = &sandbox.Error{Name: ev.Name, Value: ev.Value, Traceback: ev.Traceback}
		x.errSignal = ev.Signal
	case "done":
		if x.done != nil {
			x.exitCode, x.sawDone = ev.ExitCode, true
			if !x.runner.doneOnIdle {
				close(x.done)
				x.done = nil
			}
		}
	}
	return nil
}
