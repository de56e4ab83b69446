package testutil

import (
	"bytes"
	"sync"
)

// Buffer collects output (a process's, a logger's) while a test reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// SinkFunc is a sandbox.Sink that hands both streams' output to a
// function.
type SinkFunc func([]byte)

// Stdout implements sandbox.Sink.
func (f SinkFunc) Stdout(p []byte) { f(p) }

// Stderr implements sandbox.Sink.
func (f SinkFunc) Stderr(p []byte) { f(p) }
