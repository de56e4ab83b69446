package native

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/netproxy"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// TestForkEgress: a sandbox with network access forks into copies that
// each reach a proxy of their own (the one the fork gave it, never the
// source's), keep it once the source is gone and across a pause; a fork
// given no proxies is refused, and so is one while a connection through
// the proxy is open (409 conflict, saying so). It is saved as a snapshot, and the sandbox
// made of it has no network access: nothing listens at the proxy's
// address there.
func TestForkEgress(t *testing.T) {
	bothKinds(t, func(t *testing.T, b *Backend) {
		ctx := context.Background()
		proxy := func(seen *atomic.Int32) sandbox.Egress {
			return testutil.NewEgress(t, testutil.EgressConfig{Allow: []string{"example.com"}, Names: map[string][]netip.Addr{},
				Audit: func(netproxy.Event) { seen.Add(1) }})
		}
		var srcSeen, seen0, seen1 atomic.Int32
		sbx, err := b.Create(ctx, sandbox.Spec{Egress: proxy(&srcSeen)})
		if err != nil {
			t.Fatal(err)
		}
		s := sbx.(*Sandbox)
		defer s.Close()
		// Each proxy records what it answers (askProxy).
		if got := execText(t, s, askProxy); !strings.HasPrefix(got, "HTTP/1.") {
			t.Fatalf("the source's proxy: %q", got)
		}
		// Its event follows its answer: the proxy reports a connection
		// once it has ended.
		testutil.WaitFor(t, 10*time.Second, "the source's proxy's event", func() bool { return srcSeen.Load() > 0 })

		// Saved: the sandbox made of it has no proxy.
		snap := filepath.Join(t.TempDir(), "snap")
		if _, err := s.SaveSnapshot(ctx, snap); err != nil {
			t.Fatalf("snapshot of a sandbox with network access: %v", err)
		}
		fromSnap, err := b.CreateFromSnapshot(ctx, snap, sandbox.FromSnapshot{})
		if err != nil {
			t.Fatal(err)
		}
		refused := "import socket\ntry:\n  socket.create_connection(('127.0.0.1', 3128), timeout=10)\n  r = 'connected'\n" +
			"except ConnectionRefusedError:\n  r = 'refused'\nr"
		if got := execText(t, fromSnap.(*Sandbox), refused); got != "refused" {
			t.Errorf("the proxy's address in a sandbox made of the snapshot: %s", got)
		}

		fromSnap.Close() // the zygote's backend has room for three sandboxes

		if _, err := s.Fork(ctx, 1, sandbox.ForkOptions{}); !errors.Is(err, sandbox.ErrInvalidSpec) {
			t.Fatalf("a fork of a sandbox with network access given no proxies: %v", err)
		}
		// A connection open through the proxy cannot be copied: refused,
		// saying so, and the source goes on.
		execText(t, s, "import socket\nheld = socket.create_connection(('127.0.0.1', 3128), timeout=10)")
		if _, err := s.Fork(ctx, 1, sandbox.ForkOptions{Egress: []sandbox.Egress{proxy(&seen0)}}); !errors.Is(err, sandbox.ErrCannotKeep) ||
			!strings.Contains(err.Error(), "TCP connection") {
			t.Fatalf("a fork with a connection to the proxy open: %v", err)
		}
		execText(t, s, "held.close()")
		copies, err := s.Fork(ctx, 2, sandbox.ForkOptions{Egress: []sandbox.Egress{proxy(&seen0), proxy(&seen1)}})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range copies {
			defer c.Close()
		}

		s.Close()
		before := srcSeen.Load()
		for i, seen := range []*atomic.Int32{&seen0, &seen1} {
			c := copies[i].(*Sandbox)
			for round := 0; round < 2; round++ {
				n := seen.Load()
				if got := execText(t, c, askProxy); !strings.HasPrefix(got, "HTTP/1.") {
					t.Fatalf("copy %d (round %d): %q", i, round, got)
				}
				testutil.WaitFor(t, 10*time.Second, fmt.Sprintf("copy %d's proxy's event (round %d)", i, round),
					func() bool { return seen.Load() > n })
				testutil.Pause(t, c)
				testutil.Resume(t, c)
			}
		}
		if srcSeen.Load() != before {
			t.Errorf("the source's proxy saw the copies' connections")
		}
	})
}
