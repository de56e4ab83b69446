package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// pausingBackend makes idle sandboxes that can be paused: for tests of
// what the service keeps about a paused sandbox (its state, timeouts,
// automatic resumes). The pausing itself is the backends' and is tested
// there (native: TestPause*).
type pausingBackend struct{ made chan *pausingSandbox }

func (pausingBackend) Name() string { return "pausing" }

func (b pausingBackend) Create(context.Context, sandbox.Spec) (sandbox.Sandbox, error) {
	s := &pausingSandbox{}
	b.made <- s
	return s, nil
}

type pausingSandbox struct {
	idleSandbox
	mu              sync.Mutex
	paused          bool
	pauses, resumes int
	failNext        error
}

func (s *pausingSandbox) Pause(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.failNext; err != nil {
		s.failNext = nil
		return err
	}
	s.paused = true
	s.pauses++
	return nil
}

func (s *pausingSandbox) Resume(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.paused = false
	s.resumes++
	return nil
}

func (s *pausingSandbox) PauseSupported() error { return nil }

func (s *pausingSandbox) Paused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paused
}

// clock is a settable Config.Now that counts its readers.
type clock struct{ ns, reads atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *clock) now() time.Time          { c.reads.Add(1); return time.Unix(0, c.ns.Load()).UTC() }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// waitReaper returns once a whole round of the reaper has run since it
// was called, where nothing else reads the clock: a round reads it once,
// as it begins, so the second read from now begins the round after one
// that saw the clock as it is now.
func (c *clock) waitReaper(t *testing.T) {
	t.Helper()
	from := c.reads.Load()
	testutil.WaitFor(t, 10*time.Second, "a round of the reaper", func() bool { return c.reads.Load() >= from+2 })
}

func waitState(t *testing.T, svc *Service, id, want string) Info {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, err := svc.Info("o", id)
		if err == nil && info.State == want {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s: state %q (err %v), want %q", id, info.State, err, want)
		}
	}
}

// A sandbox is paused and resumed on request: its state says so, a second
// pause or a resume of a running sandbox changes nothing and says why,
// and the time it spent paused does not count against its lifetime.
func TestPauseResume(t *testing.T) {
	be := pausingBackend{made: make(chan *pausingSandbox, 4)}
	c := newClock()
	svc := New(Config{Backend: be, Now: c.now, DefaultLifetime: time.Hour})
	defer svc.Close()
	ctx := context.Background()
	info, err := svc.Create(ctx, CreateRequest{Owner: "o"})
	if err != nil {
		t.Fatal(err)
	}
	sb := <-be.made
	if info.State != "idle" || info.OnTimeout != OnTimeoutKill || info.AutoResume || info.PausedAt != nil {
		t.Fatalf("created: %+v", info)
	}
	if _, err := svc.Resume(ctx, "o", info.ID); !errors.Is(err, ErrNotPaused) {
		t.Fatalf("resume of a running sandbox: %v", err)
	}
	if _, err := svc.Pause(ctx, "other", info.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another owner's pause: %v", err)
	}
	p, err := svc.Pause(ctx, "o", info.ID)
	if err != nil || p.State != "paused" || p.PausedAt == nil || !sb.Paused() {
		t.Fatalf("pause: %+v, %v", p, err)
	}
	if _, err := svc.Pause(ctx, "o", info.ID); !errors.Is(err, ErrAlreadyPaused) || !errors.Is(err, sandbox.ErrPaused) {
		t.Fatalf("second pause: %v", err)
	}
	// Paused for longer than its idle timeout and lifetime: still there.
	c.advance(2 * time.Hour)
	c.waitReaper(t)
	// Get without AutoResume leaves it paused.
	if _, err := svc.Get("o", info.ID); err != nil || !sb.Paused() {
		t.Fatalf("Get of a paused sandbox without auto-resume: %v, paused %v", err, sb.Paused())
	}
	r, err := svc.Resume(ctx, "o", info.ID)
	if err != nil || r.State != "idle" || sb.Paused() {
		t.Fatalf("resume: %+v, %v", r, err)
	}
	if got, want := r.Deadline, info.Deadline.Add(2*time.Hour); !got.Equal(want) {
		t.Errorf("lifetime's end after two paused hours: %v, want %v", got, want)
	}
	if sb.pauses != 1 || sb.resumes != 1 {
		t.Errorf("the sandbox was paused %d and resumed %d times", sb.pauses, sb.resumes)
	}
	// A pause that fails leaves it running and says why.
	sb.mu.Lock()
	sb.failNext = errors.New("dump failed")
	sb.mu.Unlock()
	if _, err := svc.Pause(ctx, "o", info.ID); err == nil || err.Error() != "dump failed" {
		t.Fatalf("failed pause: %v", err)
	}
	if i, _ := svc.Info("o", info.ID); i.State != "idle" {
		t.Fatalf("after a failed pause: %+v", i)
	}
}

// A sandbox made with on_timeout "pause" is paused by its idle timeout,
// not closed; with auto_resume, the next operation resumes it; a paused
// sandbox is closed once it has been paused for MaxPaused.
func TestPauseOnTimeout(t *testing.T) {
	be := pausingBackend{made: make(chan *pausingSandbox, 4)}
	c := newClock()
	svc := New(Config{Backend: be, Now: c.now, MaxPaused: 24 * time.Hour})
	defer svc.Close()
	ctx := context.Background()
	info, err := svc.Create(ctx, CreateRequest{Owner: "o", Idle: time.Minute, OnTimeout: OnTimeoutPause, AutoResume: true})
	if err != nil {
		t.Fatal(err)
	}
	sb := <-be.made
	if info.OnTimeout != OnTimeoutPause || !info.AutoResume {
		t.Fatalf("created: %+v", info)
	}
	c.advance(2 * time.Minute)
	waitState(t, svc, info.ID, "paused")
	if sb.closed.Load() {
		t.Fatal("the timeout closed the sandbox")
	}
	if _, err := svc.Get("o", info.ID); err != nil || sb.Paused() {
		t.Fatalf("an operation on an auto-resuming sandbox: %v, paused %v", err, sb.Paused())
	}
	waitState(t, svc, info.ID, "idle")
	c.advance(2 * time.Minute)
	waitState(t, svc, info.ID, "paused")
	c.advance(25 * time.Hour)
	for deadline := time.Now().Add(5 * time.Second); !sb.closed.Load(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a sandbox paused for longer than MaxPaused was kept")
		}
	}
	if _, err := svc.Info("o", info.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after MaxPaused: %v", err)
	}
}

// What cannot be paused says so: a backend without pausing, and requests
// that do not make sense.
func TestPauseRefused(t *testing.T) {
	svc := New(Config{Backend: newFakeBackend()})
	defer svc.Close()
	ctx := context.Background()
	info, err := svc.Create(ctx, CreateRequest{Owner: "o"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Pause(ctx, "o", info.ID); !errors.Is(err, sandbox.ErrUnsupported) {
		t.Fatalf("pause on a backend without it: %v", err)
	}
	for _, req := range []CreateRequest{{Owner: "o", OnTimeout: "sleep"}, {Owner: "o", OnTimeout: "Pause"}} {
		if _, err := svc.Create(ctx, req); !errors.Is(err, sandbox.ErrInvalidSpec) {
			t.Errorf("%+v: %v", req, err)
		}
	}
	// A backend that cannot pause refuses on_timeout "pause" at once.
	if _, err := svc.Create(ctx, CreateRequest{Owner: "o", OnTimeout: OnTimeoutPause}); !errors.Is(err, sandbox.ErrUnsupported) {
		t.Fatalf("on_timeout pause on a backend without pausing: %v", err)
	}
	// A sandbox whose pause fails when its timeout comes (this one cannot
	// be paused, as a native sandbox forked from a zygote) is closed, as
	// a timeout does.
	be := pausingBackend{made: make(chan *pausingSandbox, 1)}
	c := newClock()
	svc2 := New(Config{Backend: be, Now: c.now})
	defer svc2.Close()
	info, err = svc2.Create(ctx, CreateRequest{Owner: "o", Idle: time.Minute, OnTimeout: OnTimeoutPause})
	if err != nil {
		t.Fatal(err)
	}
	sb := <-be.made
	sb.mu.Lock()
	sb.failNext = fmt.Errorf("%w: a zygote's sandbox", sandbox.ErrUnsupported)
	sb.mu.Unlock()
	c.advance(2 * time.Minute)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := svc2.Info("o", info.ID); errors.Is(err, ErrNotFound) && sb.closed.Load() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a sandbox that could not pause outlived its timeout")
		}
	}
}

func (s *pausingSandbox) ForkSupported() error { return nil }

func (s *pausingSandbox) Fork(_ context.Context, n int, _ sandbox.ForkOptions) ([]sandbox.Sandbox, error) {
	out := make([]sandbox.Sandbox, n)
	for i := range out {
		out[i] = &pausingSandbox{}
	}
	return out, nil
}

// A fork's copies are sandboxes of the owner's: listed, counted against
// its quota, with the source's settings and a lifetime of their own.
func TestFork(t *testing.T) {
	be := pausingBackend{made: make(chan *pausingSandbox, 4)}
	svc := New(Config{Backend: be, MaxPerOwner: 4})
	defer svc.Close()
	ctx := context.Background()
	src, err := svc.Create(ctx, CreateRequest{Owner: "o", Metadata: map[string]string{"k": "v"}, Idle: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, sandbox.MaxFork + 1} {
		if _, err := svc.Fork(ctx, "o", src.ID, n, sandbox.ForkOptions{}); !errors.Is(err, sandbox.ErrInvalidSpec) {
			t.Errorf("a fork of %d: %v", n, err)
		}
	}
	if _, err := svc.Fork(ctx, "other", src.ID, 1, sandbox.ForkOptions{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("another owner's fork: %v", err)
	}
	if _, err := svc.Fork(ctx, "o", src.ID, 4, sandbox.ForkOptions{}); !errors.Is(err, ErrQuota) {
		t.Errorf("a fork past the quota: %v", err)
	}
	copies, err := svc.Fork(ctx, "o", src.ID, 3, sandbox.ForkOptions{})
	if err != nil || len(copies) != 3 {
		t.Fatalf("fork: %v, %d", err, len(copies))
	}
	for _, c := range copies {
		if c.ID == src.ID || c.Metadata["k"] != "v" || c.IdleTimeoutS != 60 {
			t.Errorf("a copy: %+v", c)
		}
	}
	if got := len(svc.List("o")); got != 4 {
		t.Errorf("%d sandboxes listed, want 4", got)
	}
	if _, err := svc.Pause(ctx, "o", src.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Fork(ctx, "o", copies[0].ID, 1, sandbox.ForkOptions{}); !errors.Is(err, ErrQuota) {
		t.Errorf("a fork at the quota: %v", err)
	}
	svc.Delete("o", copies[0].ID)
	// A paused sandbox is resumed for its copy, and paused again.
	if _, err := svc.Fork(ctx, "o", src.ID, 1, sandbox.ForkOptions{}); err != nil {
		t.Errorf("a fork of a paused sandbox: %v", err)
	}
	if b, err := svc.Get("o", src.ID); err != nil || !b.Paused() {
		t.Errorf("the source after a copy of it paused: %v, paused %v", err, err == nil && b.Paused())
	}
}
