package pool

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// fake is a backend of numbered sandboxes that records their lives. Its
// next fail creations fail; with gate set, creations wait until it is
// closed.
type fake struct {
	made, closed atomic.Int64
	fail         atomic.Int64
	gate         chan struct{}
	mu           sync.Mutex
	dead         map[int64]bool
}

type fakeSandbox struct {
	sandbox.Sandbox // nil: only what the pool calls is implemented
	f               *fake
	n               int64
	spec            sandbox.Spec
	once            sync.Once
}

func (f *fake) Name() string { return "fake" }
func (f *fake) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if f.gate != nil {
		<-f.gate
	}
	if f.fail.Add(-1) >= 0 {
		return nil, errors.New("no sandbox today")
	}
	f.fail.Store(0)
	return &fakeSandbox{f: f, n: f.made.Add(1), spec: spec}, nil
}
func (s *fakeSandbox) Close() error {
	s.once.Do(func() { s.f.closed.Add(1) })
	return nil
}
func (s *fakeSandbox) Alive() bool {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	return !s.f.dead[s.n]
}

func TestServesReadySandboxesOfTheSameConfiguration(t *testing.T) {
	f := &fake{dead: map[int64]bool{}}
	p := New(Config{Backend: f, Max: 3, Min: 2})
	defer p.Close()
	small := sandbox.Spec{Limits: sandbox.Limits{Memory: 64 << 20}}
	big := sandbox.Spec{Limits: sandbox.Limits{Memory: 128 << 20}}
	p.Prewarm(small, 2)
	testutil.WaitFor(t, 5*time.Second, "the pool to fill", func() bool { return f.made.Load() == 2 })

	a, _ := p.Create(context.Background(), small)
	if a.(*fakeSandbox).n != 1 {
		t.Fatalf("got sandbox %d, want the first pooled one", a.(*fakeSandbox).n)
	}
	// Another configuration is never served from this one's sandboxes.
	c, _ := p.Create(context.Background(), big)
	if c.(*fakeSandbox).spec.Limits.Memory != big.Limits.Memory {
		t.Fatal("served a sandbox of another configuration")
	}
	// A sandbox that died while it waited is not handed out.
	f.mu.Lock()
	f.dead[2] = true
	f.mu.Unlock()
	testutil.WaitFor(t, 5*time.Second, "the refill", func() bool {
		for _, s := range p.Stats() {
			if s.Spec.Limits.Memory == small.Limits.Memory && s.Ready == 2 {
				return true
			}
		}
		return false
	})
	d, _ := p.Create(context.Background(), small)
	if d.(*fakeSandbox).n == 2 {
		t.Fatal("handed out a dead sandbox")
	}
	// Handed-out sandboxes are the caller's: the pool never serves one
	// twice.
	seen := map[int64]bool{1: true, d.(*fakeSandbox).n: true, c.(*fakeSandbox).n: true}
	for range 10 {
		s, _ := p.Create(context.Background(), small)
		n := s.(*fakeSandbox).n
		if seen[n] {
			t.Fatalf("sandbox %d served twice", n)
		}
		seen[n] = true
	}
	stats := p.Stats()
	var hits, misses int64
	for _, s := range stats {
		hits += s.Hits
		misses += s.Misses
	}
	if hits == 0 || misses == 0 {
		t.Fatalf("stats %+v", stats)
	}
}

func TestMissesRaiseTheTargetAndCloseEmpties(t *testing.T) {
	// Creations wait at the gate, so that all six requests find the pool
	// empty and miss.
	f := &fake{dead: map[int64]bool{}, gate: make(chan struct{})}
	p := New(Config{Backend: f, Max: 4, Min: 0})
	spec := sandbox.Spec{}
	var requests sync.WaitGroup
	for range 6 {
		requests.Go(func() { p.Create(context.Background(), spec) })
	}
	testutil.WaitFor(t, 5*time.Second, "six misses", func() bool {
		st := p.Stats()
		return len(st) == 1 && st[0].Misses == 6
	})
	close(f.gate)
	requests.Wait()
	testutil.WaitFor(t, 5*time.Second, "the target to grow to the maximum", func() bool {
		st := p.Stats()
		return len(st) == 1 && st[0].Target == 4 && st[0].Ready == 4
	})
	p.Close()
	// Six handed out (the caller closes those), four ready closed.
	if got := f.closed.Load(); got != 4 {
		t.Fatalf("closed %d, want the 4 ready ones", got)
	}
	if _, err := p.Create(context.Background(), spec); err == nil {
		t.Fatal("a closed pool made a sandbox")
	}
}

func TestIdleConfigurationsAreDropped(t *testing.T) {
	f := &fake{dead: map[int64]bool{}}
	p := New(Config{Backend: f, Max: 2, Min: 1, Idle: 50 * time.Millisecond})
	defer p.Close()
	p.Prewarm(sandbox.Spec{}, 2)
	testutil.WaitFor(t, 5*time.Second, "an idle configuration to be dropped", func() bool {
		return len(p.Stats()) == 0 && f.closed.Load() == f.made.Load() && f.made.Load() > 0
	})
}

func TestDisabledPoolPassesThrough(t *testing.T) {
	f := &fake{dead: map[int64]bool{}}
	p := New(Config{Backend: f, Max: 0})
	defer p.Close()
	p.Prewarm(sandbox.Spec{}, 3)
	p.Create(context.Background(), sandbox.Spec{})
	// Close waits for every creation the pool started: none may have.
	p.Close()
	if f.made.Load() != 1 {
		t.Fatalf("made %d", f.made.Load())
	}
}

// A ready sandbox that dies while it waits is closed and replaced by the
// pool itself, before any request comes.
func TestDeadReadySandboxesAreReplaced(t *testing.T) {
	f := &fake{dead: map[int64]bool{}}
	p := New(Config{Backend: f, Max: 2, Min: 2})
	defer p.Close()
	p.Prewarm(sandbox.Spec{}, 2)
	testutil.WaitFor(t, 5*time.Second, "the pool to fill", func() bool { return f.made.Load() == 2 })
	f.mu.Lock()
	f.dead[1] = true
	f.mu.Unlock()
	testutil.WaitFor(t, 10*time.Second, "the dead sandbox to be closed and replaced", func() bool {
		st := p.Stats()
		return f.closed.Load() == 1 && f.made.Load() == 3 && len(st) == 1 && st[0].Ready == 2
	})
	for range 2 {
		sb, _ := p.Create(context.Background(), sandbox.Spec{})
		if sb.(*fakeSandbox).n == 1 {
			t.Fatal("handed out the dead sandbox")
		}
	}
}

// A creation that failed is tried again without waiting for a request.
func TestRefillsAfterAFailure(t *testing.T) {
	f := &fake{dead: map[int64]bool{}}
	f.fail.Store(1)
	p := New(Config{Backend: f, Max: 2, Min: 1})
	defer p.Close()
	p.Prewarm(sandbox.Spec{}, 1)
	testutil.WaitFor(t, 15*time.Second, "the pool to fill after a failed creation", func() bool {
		st := p.Stats()
		return len(st) == 1 && st[0].Ready == 1
	})
}

// A tenant keeps at most Configs configurations ready: one more drops
// its least recently used, whose ready sandboxes are closed; another
// tenant's are untouched. No client, however many configurations it asks
// for, holds more than Configs*Max ready sandboxes.
func TestTenantsKeepFewConfigurations(t *testing.T) {
	f := &fake{dead: map[int64]bool{}}
	p := New(Config{Backend: f, Max: 2, Min: 1, Configs: 3})
	defer p.Close()
	spec := func(tenant string, n int) sandbox.Spec {
		return sandbox.Spec{Tenant: tenant, Env: map[string]string{"N": string(rune('a' + n))}}
	}
	readyOf := func() map[string]int {
		m := map[string]int{}
		for _, s := range p.Stats() {
			m[s.Spec.Tenant+"/"+s.Spec.Env["N"]] = s.Ready
		}
		return m
	}
	p.Prewarm(spec("other", 0), 2)
	for n := range 3 {
		if _, err := p.Create(context.Background(), spec("t", n)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // distinct last uses
	}
	testutil.WaitFor(t, 5*time.Second, "four configurations filled", func() bool {
		m := readyOf()
		return len(m) == 4 && m["t/a"] == 1 && m["t/b"] == 1 && m["t/c"] == 1 && m["other/a"] == 2
	})
	// t/a used again: t/b is the least recently used.
	if _, err := p.Create(context.Background(), spec("t", 0)); err != nil {
		t.Fatal(err)
	}
	closedBefore := f.closed.Load()
	time.Sleep(5 * time.Millisecond)
	if _, err := p.Create(context.Background(), spec("t", 3)); err != nil {
		t.Fatal(err)
	}
	if m := readyOf(); len(m) != 4 {
		t.Fatalf("a fourth configuration of t: the pool keeps %v, want t/b dropped", m)
	} else if _, ok := m["t/a"]; !ok {
		t.Fatalf("t/a, used last, was dropped: %v", m)
	}
	if _, ok := readyOf()["t/b"]; ok {
		t.Fatal("t/b, the least recently used, was kept")
	}
	for n := 4; n < 40; n++ {
		if _, err := p.Create(context.Background(), spec("t", n)); err != nil {
			t.Fatal(err)
		}
		if got := len(readyOf()); got > 4 {
			t.Fatalf("after %d configurations of one tenant the pool keeps %d", n+1, got)
		}
	}
	testutil.WaitFor(t, 5*time.Second, "the dropped configurations' sandboxes closed", func() bool {
		m := readyOf()
		_, a := m["t/a"]
		_, b := m["t/b"]
		return !a && !b && m["other/a"] == 2 && f.closed.Load() > closedBefore
	})
	if got := p.Evicted(); got != 37 {
		t.Errorf("%d configurations evicted, want 37", got)
	}
	p.Close()
	// Every sandbox made was handed out or closed: none left behind.
	if made, closed := f.made.Load(), f.closed.Load(); made-closed != 40+1 {
		t.Errorf("made %d, closed %d: %d open, want the 41 handed out", made, closed, made-closed)
	}
}

// A configuration's first request makes its own sandbox alone: no refill
// competes with it; then the pool keeps Min ready (a miss after that
// raises the target: TestMissesRaiseTheTargetAndCloseEmpties).
func TestFirstRequestMadeBeforeTheRefills(t *testing.T) {
	f := &fake{dead: map[int64]bool{}, gate: make(chan struct{})}
	p := New(Config{Backend: f, Max: 4, Min: 1})
	defer p.Close()
	spec := sandbox.Spec{Env: map[string]string{"A": "1"}}
	got := make(chan sandbox.Sandbox, 1)
	go func() {
		sb, _ := p.Create(context.Background(), spec)
		got <- sb
	}()
	testutil.WaitFor(t, 5*time.Second, "the first request's miss", func() bool {
		st := p.Stats()
		return len(st) == 1 && st[0].Misses == 1
	})
	time.Sleep(20 * time.Millisecond)
	if st := p.Stats(); st[0].Creating != 0 || st[0].Target != 1 {
		t.Fatalf("while the first sandbox is made: %d refills, target %d; want none, and Min", st[0].Creating, st[0].Target)
	}
	close(f.gate)
	if sb := <-got; sb == nil || sb.(*fakeSandbox).n != 1 {
		t.Fatalf("the first request got %v, want the first sandbox made", sb)
	}
	testutil.WaitFor(t, 5*time.Second, "Min ready", func() bool {
		st := p.Stats()
		return len(st) == 1 && st[0].Ready == 1
	})
	if st := p.Stats(); st[0].Target != 1 || f.made.Load() != 2 {
		t.Fatalf("after the first request: target %d, %d made; want 1 and 2", st[0].Target, f.made.Load())
	}
}
