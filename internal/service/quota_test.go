package service

import (
	"errors"
	"testing"
)

// TestRunningElsewhere: a node of a cluster counts the key's executions
// running on the other nodes against the key's execution quota.
func TestRunningElsewhere(t *testing.T) {
	elsewhere := map[string]int{"alice": 2}
	svc := New(Config{Backend: newFakeBackend(), MaxExecutionsPerOwner: 3,
		RunningElsewhere: func(owner string) int { return elsewhere[owner] }})
	defer svc.Close()
	release, err := svc.acquire("alice")
	if err != nil {
		t.Fatalf("the key's third execution (two elsewhere): %v", err)
	}
	if got := svc.Running()["alice"]; got != 1 {
		t.Fatalf("Running()[alice] = %d, want 1", got)
	}
	if _, err := svc.acquire("alice"); !errors.Is(err, ErrQuota) {
		t.Fatalf("a fourth execution with a quota of 3: %v, want ErrQuota", err)
	}
	if r, err := svc.acquire("bob"); err != nil {
		t.Fatalf("another key: %v", err)
	} else {
		r()
	}
	elsewhere["alice"] = 1
	r, err := svc.acquire("alice")
	if err != nil {
		t.Fatalf("once one elsewhere ended: %v", err)
	}
	r()
	release()
	if got := svc.Running(); len(got) != 0 {
		t.Fatalf("Running() once all ended: %v", got)
	}
}
