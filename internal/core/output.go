package core

import "sync"

// maxSetupOutput is what is kept of output written outside an execution
// (a runner failing to start, say), to explain a setup failure.
const maxSetupOutput = 16 << 10

// Output is one output stream of a sandbox (its stdout or stderr), as the
// current execution collects it: at most a limit of bytes is kept and
// passed to the execution's sink, the rest is counted and dropped. A write
// never fails and never blocks on the limit, so a flood cannot stall the
// writer or grow memory. Outside executions, the first maxSetupOutput
// bytes are kept for Setup.
type Output struct {
	mu      sync.Mutex
	active  bool
	buf     []byte
	limit   int64
	dropped int64
	sink    func([]byte)
	setup   []byte
}

// Write implements io.Writer; it always succeeds.
func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.active {
		if room := maxSetupOutput - len(o.setup); room > 0 {
			o.setup = append(o.setup, p[:min(room, len(p))]...)
		}
		return len(p), nil
	}
	room := o.limit - int64(len(o.buf))
	keep := min(int64(len(p)), max(room, 0))
	o.dropped += int64(len(p)) - keep
	if keep > 0 {
		o.buf = append(o.buf, p[:keep]...)
		if o.sink != nil {
			o.sink(p[:keep])
		}
	}
	return len(p), nil
}

// Note adds a line from the host (not the code) to the execution's output,
// within the same limit.
func (o *Output) Note(msg string) { o.Write([]byte(msg)) }

// Begin starts collecting for a new execution.
func (o *Output) Begin(limit int64, sink func([]byte)) {
	o.mu.Lock()
	o.active, o.buf, o.dropped, o.limit, o.sink = true, nil, 0, limit, sink
	o.mu.Unlock()
}

// End stops collecting and returns what the execution wrote.
func (o *Output) End() (data []byte, truncated bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	data, truncated = o.buf, o.dropped > 0
	o.active, o.buf, o.dropped, o.limit, o.sink = false, nil, 0, 0, nil
	return data, truncated
}

// Setup returns what was written outside executions.
func (o *Output) Setup() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return string(o.setup)
}
