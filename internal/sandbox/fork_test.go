package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func TestAllOrNone(t *testing.T) {
	closed := map[int]bool{}
	closeCopy := func(i int) { closed[i] = true }
	if err := allOrNone([]error{nil, nil}, closeCopy); err != nil || len(closed) != 0 {
		t.Fatalf("all made: %v, closed %v", err, closed)
	}
	boom := errors.New("boom")
	err := allOrNone([]error{nil, boom, errors.New("other")}, closeCopy)
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "2 of 3 copies failed") || len(closed) != 3 {
		t.Fatalf("two failed: %v, closed %v", err, closed)
	}
	if err := allOrNone([]error{boom}, func(int) {}); err == nil || err.Error() != "fork: boom" {
		t.Fatalf("one failed: %v", err)
	}
}

func TestCheckForkCount(t *testing.T) {
	for _, n := range []int{1, MaxFork} {
		if err := CheckForkCount(n); err != nil {
			t.Errorf("%d copies: %v", n, err)
		}
	}
	for _, n := range []int{0, -1, MaxFork + 1} {
		if err := CheckForkCount(n); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("%d copies: %v, want ErrInvalidSpec", n, err)
		}
	}
}

// copySandbox is a fork's copy: it records its executions and its Close.
type copySandbox struct {
	Sandbox
	i      int
	status Status
	code   []string
	closed atomic.Int32
}

func (c *copySandbox) Execute(_ context.Context, req ExecRequest, _ Sink) (*Result, error) {
	c.code = append(c.code, req.Code)
	return &Result{Status: c.status, Stderr: "boom"}, nil
}

func (c *copySandbox) Close() error { c.closed.Add(1); return nil }

// TestCopies makes every copy, never more at once than asked, and closes
// those made where one fails: all copies or none.
func TestCopies(t *testing.T) {
	var mu sync.Mutex
	running, most := 0, 0
	made := make([]*copySandbox, 10)
	copies, err := Copies(10, 3, func(i int) (Sandbox, error) {
		mu.Lock()
		running++
		most = max(most, running)
		mu.Unlock()
		defer func() { mu.Lock(); running--; mu.Unlock() }()
		made[i] = &copySandbox{i: i}
		return made[i], nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(copies) != 10 || most > 3 {
		t.Fatalf("%d copies, %d at once (at most 3)", len(copies), most)
	}
	for i, c := range copies {
		if c.(*copySandbox).i != i || made[i].closed.Load() != 0 {
			t.Errorf("copy %d: %+v", i, c)
		}
	}

	boom := errors.New("boom")
	made = make([]*copySandbox, 5)
	copies, err = Copies(5, 2, func(i int) (Sandbox, error) {
		if i == 1 || i == 3 {
			return nil, fmt.Errorf("copy %d: %w", i, boom)
		}
		made[i] = &copySandbox{i: i}
		return made[i], nil
	})
	if !errors.Is(err, boom) || copies != nil || !strings.Contains(err.Error(), "2 of 5 copies failed") {
		t.Fatalf("two copies failed: %v, %v", copies, err)
	}
	for _, i := range []int{0, 2, 4} {
		if made[i].closed.Load() != 1 {
			t.Errorf("copy %d, made, closed %d times", i, made[i].closed.Load())
		}
	}
}

// TestReseed reseeds a copy unless the source's random state is kept, and
// closes a copy that cannot be reseeded.
func TestReseed(t *testing.T) {
	c := &copySandbox{status: StatusOK}
	if got, err := Reseed(context.Background(), c, true); err != nil || got != c || len(c.code) != 0 {
		t.Fatalf("same random state: %v %v, ran %q", got, err, c.code)
	}
	if got, err := Reseed(context.Background(), c, false); err != nil || got != c || len(c.code) != 1 ||
		!strings.Contains(c.code[0], "seed()") {
		t.Fatalf("reseeded: %v %v, ran %q", got, err, c.code)
	}
	if c.closed.Load() != 0 {
		t.Fatal("a reseeded copy was closed")
	}
	bad := &copySandbox{status: StatusError}
	if got, err := Reseed(context.Background(), bad, false); err == nil || got != nil || bad.closed.Load() != 1 {
		t.Fatalf("a copy whose reseed failed: %v %v, closed %d times", got, err, bad.closed.Load())
	}
}
