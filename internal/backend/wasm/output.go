package wasm

import "sync"

// maxSetupOutput is what is kept of output written outside an execution
// (the interpreter failing to start, say), to explain a setup failure.
const maxSetupOutput = 16 << 10

// stream is the guest's stdout or stderr. The guest writes to it
// synchronously (a WASI fd_write is a call into the host), so once the
// runner reports a result or the end of an execution, everything printed
// before has been delivered. During an execution at most limit bytes are
// kept and passed to the sink; the rest is counted and dropped. A write
// never fails and never blocks on the limit, so a flood cannot stall or
// grow anything.
type stream struct {
	mu      sync.Mutex
	active  bool
	buf     []byte
	limit   int64
	dropped int64
	sink    func([]byte)
	setup   []byte // outside executions
}

// Write implements io.Writer for wazero.
func (s *stream) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.active {
		if room := maxSetupOutput - len(s.setup); room > 0 {
			s.setup = append(s.setup, p[:min(room, len(p))]...)
		}
		return len(p), nil
	}
	room := s.limit - int64(len(s.buf))
	keep := min(int64(len(p)), max(room, 0))
	s.dropped += int64(len(p)) - keep
	if keep > 0 {
		s.buf = append(s.buf, p[:keep]...)
		if s.sink != nil {
			s.sink(p[:keep])
		}
	}
	return len(p), nil
}

// note adds a line from the host (not the code) to the execution's
// output, within the same limit.
func (s *stream) note(msg string) { s.Write([]byte(msg)) }

// begin starts collecting for a new execution.
func (s *stream) begin(limit int64, sink func([]byte)) {
	s.mu.Lock()
	s.active, s.buf, s.dropped, s.limit, s.sink = true, nil, 0, limit, sink
	s.mu.Unlock()
}

// end stops collecting and returns what the execution wrote.
func (s *stream) end() (data []byte, truncated bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	data, truncated = s.buf, s.dropped > 0
	s.active, s.buf, s.dropped, s.limit, s.sink = false, nil, 0, 0, nil
	return data, truncated
}

// setupOutput returns what was written outside executions.
func (s *stream) setupOutput() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.setup)
}
