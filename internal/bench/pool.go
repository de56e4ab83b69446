package bench

import (
	"context"
	"errors"
	"sync"
)

// pool gives each concurrent caller a client of its own (a warm sandbox, a
// Jupyter driver), starting one when none is idle. Subjects whose clients
// serve one request at a time use it so that Run stays safe for concurrent
// use: latency rows then use one client, throughput rows one per client.
type pool[C comparable] struct {
	open  func(ctx context.Context) (C, error)
	close func(C) error

	mu   sync.Mutex
	idle []C
	all  map[C]struct{}
}

func newPool[C comparable](open func(context.Context) (C, error), close func(C) error) *pool[C] {
	return &pool[C]{open: open, close: close, all: map[C]struct{}{}}
}

// with runs f with a client; a client f failed with is closed rather than
// reused, as it may be in any state.
func (p *pool[C]) with(ctx context.Context, f func(C) error) error {
	c, err := p.get(ctx)
	if err != nil {
		return err
	}
	if err := f(c); err != nil {
		p.discard(c)
		return err
	}
	p.put(c)
	return nil
}

func (p *pool[C]) get(ctx context.Context) (C, error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		c := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return c, nil
	}
	p.mu.Unlock()
	c, err := p.open(ctx)
	if err != nil {
		return c, err
	}
	p.mu.Lock()
	p.all[c] = struct{}{}
	p.mu.Unlock()
	return c, nil
}

func (p *pool[C]) put(c C) {
	p.mu.Lock()
	p.idle = append(p.idle, c)
	p.mu.Unlock()
}

func (p *pool[C]) discard(c C) {
	p.mu.Lock()
	delete(p.all, c)
	p.mu.Unlock()
	p.close(c)
}

// closeAll closes every client, idle or not; call it once no Run is left.
func (p *pool[C]) closeAll() error {
	p.mu.Lock()
	all := p.all
	p.all, p.idle = map[C]struct{}{}, nil
	p.mu.Unlock()
	var errs []error
	for c := range all {
		errs = append(errs, p.close(c))
	}
	return errors.Join(errs...)
}
