package testutil

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Pause pauses p, and fails t unless it is paused then; it returns how
// long the pause took, for the test's log.
func Pause(t testing.TB, p sandbox.Pauser) time.Duration {
	t.Helper()
	return timed(t, "Pause", p.Pause, p, true)
}

// Resume resumes p, and fails t unless it runs then; it returns how long
// the resume took, for the test's log.
func Resume(t testing.TB, p sandbox.Pauser) time.Duration {
	t.Helper()
	return timed(t, "Resume", p.Resume, p, false)
}

// timed calls do (p's Pause or Resume), named what, and checks that p is
// paused, or not, after it.
func timed(t testing.TB, what string, do func(context.Context) error, p sandbox.Pauser, paused bool) time.Duration {
	t.Helper()
	start := time.Now()
	if err := do(context.Background()); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	took := time.Since(start)
	if p.Paused() != paused {
		t.Fatalf("Paused() is %v after %s", !paused, what)
	}
	return took
}

// CheckPaused checks what every backend's paused sandbox does: each call
// that needs its processes answers sandbox.ErrPaused (an execution, a
// command, an interrupt, a restart, a new code context, a dial of port),
// a second Pause does nothing, and its workspace's file kept reads
// "kept".
func CheckPaused(t testing.TB, sb sandbox.Sandbox, port int, kept string) {
	t.Helper()
	ctx := context.Background()
	if _, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "x"}, nil); !errors.Is(err, sandbox.ErrPaused) {
		t.Errorf("Execute while paused: %v", err)
	}
	if _, err := sb.Start(ctx, sandbox.Command{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrPaused) {
		t.Errorf("Start while paused: %v", err)
	}
	if err := sb.Interrupt(); !errors.Is(err, sandbox.ErrPaused) {
		t.Errorf("Interrupt while paused: %v", err)
	}
	if err := sb.Restart(ctx); !errors.Is(err, sandbox.ErrPaused) {
		t.Errorf("Restart while paused: %v", err)
	}
	if ck, ok := sb.(sandbox.ContextKeeper); ok {
		if _, err := ck.CreateContext("python", ""); !errors.Is(err, sandbox.ErrPaused) {
			t.Errorf("CreateContext while paused: %v", err)
		}
	}
	if pd, ok := sb.(sandbox.PortDialer); ok {
		if _, err := pd.DialPort(ctx, port); !errors.Is(err, sandbox.ErrPaused) {
			t.Errorf("DialPort while paused: %v", err)
		}
	}
	if err := sb.(sandbox.Pauser).Pause(ctx); err != nil {
		t.Errorf("Pause of a paused sandbox: %v", err)
	}
	r, _, err := sb.Workspace().OpenFile(kept)
	if err != nil {
		t.Errorf("a workspace file while paused: %v", err)
		return
	}
	defer r.Close()
	if b, _ := io.ReadAll(r); string(b) != "kept" {
		t.Errorf("%s while paused: %q", kept, b)
	}
}
