package service

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// A new sandbox that does not fit under a memory ceiling is refused at
// once, saying which ceiling: the server's with ErrNoRoom, the key's with
// ErrQuota; one that fits is made, and sandboxes of a backend under no
// ceiling are not asked about.
func TestCreateRefusedAtAMemoryCeiling(t *testing.T) {
	const mib = 1 << 20
	held := map[string]int64{"": 100 * mib, "alice": 40 * mib, "bob": 90 * mib}
	ceiling := map[string]int64{"": 200 * mib, "alice": 100 * mib, "bob": 100 * mib}
	var asked []string
	svc := New(Config{Backend: newFakeBackend(), Tenants: true,
		MemoryHeld: func(backend, tenant string) (int64, int64, error) {
			asked = append(asked, backend+"/"+tenant)
			return held[tenant], ceiling[tenant], nil
		}})
	defer svc.Close()
	ctx := context.Background()

	if _, err := svc.Create(ctx, CreateRequest{Owner: "alice"}); err != nil {
		t.Fatalf("under both ceilings: %v", err)
	}
	if strings.Join(asked, " ") != "idle/ idle/alice" {
		t.Errorf("ceilings read: %v, want the server's and alice's of the default backend", asked)
	}
	_, err := svc.Create(ctx, CreateRequest{Owner: "bob"})
	if !errors.Is(err, ErrQuota) || !strings.Contains(err.Error(), "this key's sandboxes hold 90 MiB of the 100 MiB") {
		t.Errorf("at the key's ceiling: %v, want ErrQuota naming it", err)
	}
	held[""] = 190 * mib
	_, err = svc.Create(ctx, CreateRequest{Owner: "alice"})
	if !errors.Is(err, sandbox.ErrNoRoom) || !strings.Contains(err.Error(), "the server's sandboxes hold 190 MiB of the 200 MiB") {
		t.Errorf("at the server's ceiling: %v, want ErrNoRoom naming it", err)
	}
	if _, err := svc.RunOnce(ctx, "alice", sandbox.OneShot{Request: sandbox.ExecRequest{Code: "print(1)"}}); !errors.Is(err, sandbox.ErrNoRoom) {
		t.Errorf("a one-shot at the server's ceiling: %v, want ErrNoRoom", err)
	}
	if got := len(svc.List("alice")); got != 1 {
		t.Errorf("alice has %d sandboxes, want the one made before the ceiling", got)
	}
	ceiling[""] = 0 // no ceiling
	if _, err := svc.Create(ctx, CreateRequest{Owner: "alice"}); err != nil {
		t.Errorf("without a ceiling: %v", err)
	}
}
