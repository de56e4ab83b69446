package core

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// Each waiter sees its own answer, however many wait at once and in
// whatever order the answers come (each covers those before it); a peer
// that ends, or a deadline, ends the wait.
func TestAnswers(t *testing.T) {
	var a Answers
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 5)
	for i := range errs {
		wg.Go(func() { errs[i] = a.Wait(ctx, uint64(i+1), nil) })
	}
	a.Answered(2)
	a.Answered(5) // answers 3 and 4 too
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("waiter %d: %v", i+1, err)
		}
	}
	if err := a.Wait(ctx, 4, nil); err != nil {
		t.Errorf("an answer already given: %v", err)
	}

	gone := make(chan struct{})
	close(gone)
	if err := a.Wait(ctx, 6, gone); !errors.Is(err, ErrGone) {
		t.Errorf("a peer gone: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	if err := a.Wait(short, 6, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("no answer: %v", err)
	}
}
