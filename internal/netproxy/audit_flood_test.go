package netproxy

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/store"
)

// A sandbox that loops over refused connections (a name that leads to
// loopback, the metadata address, 100 private addresses) leaves the
// server's audit log a bounded number of rows whose counts add up to its
// connections; its allowed connections keep a row each.
func TestRefusedFloodIsCountedInTheAuditLog(t *testing.T) {
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	audit := store.NewAuditLog(st, slog.New(slog.DiscardHandler), store.AuditOptions{})
	var w *world
	w = newWorld(t, []string{"example.com", "rebind.example.com", "meta.example.com"}, netpolicy.Limits{}, func(c *Config) {
		c.ConnRate = 10000 // the flood's pace is not what this test is about
		c.Audit = func(e Event) {
			w.mu.Lock()
			w.events = append(w.events, e)
			w.mu.Unlock()
			// As the service records a sandbox's connections.
			audit.Record(store.Record{Time: e.Time, Kind: "net", KeyID: "key_1", SandboxID: "sb_1", Status: e.Outcome,
				Detail: e.Reason, Host: e.Host, Port: e.Port, BytesIn: e.BytesIn, BytesOut: e.BytesOut})
		}
	})

	const workers, each = 8, 60
	var wg sync.WaitGroup
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				var u string
				switch i % 3 {
				case 0:
					u = "http://rebind.example.com/"
				case 1:
					u = "http://meta.example.com/latest/meta-data/"
				default:
					u = fmt.Sprintf("http://10.0.%d.%d/", g, i)
				}
				// 429 when past the sandbox's connections at once.
				if code, status, _ := w.get(u); code != 403 && code != 429 {
					t.Errorf("%s: %d %s, want 403 or 429", u, code, status)
					return
				}
			}
		}()
	}
	wg.Wait()
	for range 5 {
		if code, _, _ := w.get("http://example.com/"); code != 200 {
			t.Fatalf("example.com: %d", code)
		}
	}
	w.waitEvents(workers*each + 5)
	audit.Close()

	recs, err := st.Audit(context.Background(), store.Query{Kind: "net", Limit: 100000})
	if err != nil {
		t.Fatal(err)
	}
	rows, counted := map[string]int64{}, map[string]int64{}
	for _, r := range recs {
		rows[r.Status]++
		counted[r.Status] += r.Count
	}
	// 2 names and 160 addresses: 64 rows of the first destinations, one
	// of the others.
	if rows["refused"] > 65 || counted["refused"] != workers*each {
		t.Errorf("%d refused connections: %d rows counting %d", workers*each, rows["refused"], counted["refused"])
	}
	if rows["allowed"] != 5 || counted["allowed"] != 5 {
		t.Errorf("5 allowed connections: %d rows counting %d", rows["allowed"], counted["allowed"])
	}
}
