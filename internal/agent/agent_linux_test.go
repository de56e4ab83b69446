package agent

import (
	"os"
	"testing"
)

func TestQueueDropsPastItsBound(t *testing.T) {
	// A reader that never reads: the queue holds at most maxQueued bytes
	// and push never blocks.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	q := newQueue(w)
	chunk := make([]byte, 1<<20)
	for i := 0; i < 2*maxQueued/len(chunk); i++ {
		q.push(chunk)
	}
	q.mu.Lock()
	size := q.size
	q.mu.Unlock()
	if size > maxQueued {
		t.Fatalf("queue holds %d bytes, bound %d", size, maxQueued)
	}
	q.close()
}
