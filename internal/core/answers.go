package core

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Answers follows the answers of a peer that answers numbered requests in
// order (an init's to interrupts, an agent's to pings): every waiter sees
// its own, however many wait at once. The zero value is ready.
type Answers struct {
	mu   sync.Mutex
	last uint64        // the highest ID answered
	ch   chan struct{} // closed and replaced at each answer
}

// ErrGone: the peer ended before it answered.
var ErrGone = errors.New("the peer ended before it answered")

// Answered records the answer to id, and to every request before it.
func (a *Answers) Answered(id uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.last = max(a.last, id)
	if a.ch != nil {
		close(a.ch)
		a.ch = nil
	}
}

// Wait returns nil once id is answered, ErrGone if gone closes first, or
// ctx's error.
func (a *Answers) Wait(ctx context.Context, id uint64, gone <-chan struct{}) error {
	for {
		a.mu.Lock()
		if a.last >= id {
			a.mu.Unlock()
			return nil
		}
		if a.ch == nil {
			a.ch = make(chan struct{})
		}
		next := a.ch
		a.mu.Unlock()
		select {
		case <-next:
		case <-gone:
			return ErrGone
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// InterruptWait bounds how long a backend's Interrupt waits for the
// runner to have its signal (Driver.Interrupt): a peer that does not
// answer (an init restored from an older server's images) is waited for
// no longer.
const InterruptWait = time.Second
