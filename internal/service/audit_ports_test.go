package service

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/store"
)

// A flood of connections to a sandbox's ports, as anyone with its preview
// link can send (to ports where nothing listens, to one where something
// does), leaves the audit log a bounded number of rows whose counts add
// up to the connections.
func TestPortFloodIsCountedInTheAuditLog(t *testing.T) {
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	audit := store.NewAuditLog(st, slog.New(slog.DiscardHandler), store.AuditOptions{})
	svc := New(Config{Backend: portBackend{withPorts: true}, Audit: audit.Record})
	defer svc.Close()
	ctx := context.Background()
	info, err := svc.Create(ctx, CreateRequest{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	box, _ := svc.Get("alice", info.ID)
	sb := box.sb.(*portSandbox)

	const refused, served = 3000, 200
	var wg sync.WaitGroup
	for w := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range refused / 10 {
				port := 8001 + (w*(refused/10)+i)%100 // 100 ports where nothing listens
				if _, err := svc.DialPort(ctx, "alice", info.ID, port); !errors.Is(err, sandbox.ErrPortClosed) {
					t.Errorf("port %d: %v", port, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for range served {
		c, err := svc.DialPort(ctx, "alice", info.ID, 8000)
		if err != nil {
			t.Fatal(err)
		}
		sb.mu.Lock()
		peer := sb.peers[len(sb.peers)-1]
		sb.mu.Unlock()
		go func() {
			io.ReadFull(peer, make([]byte, 4))
			peer.Close()
		}()
		c.Write([]byte("ping"))
		c.Close()
	}
	audit.Close() // writes what the counted rows gathered

	recs, err := st.Audit(ctx, store.Query{Kind: "port", Limit: 100000})
	if err != nil {
		t.Fatal(err)
	}
	var rows, counted map[string]int64 = map[string]int64{}, map[string]int64{}
	var bytesOut int64
	for _, r := range recs {
		rows[r.Status]++
		counted[r.Status] += r.Count
		if r.Status == "ok" {
			bytesOut += r.BytesOut
		}
	}
	// 64 ports get a row each; the other 36 share one.
	if rows["refused"] > 65 || counted["refused"] != refused {
		t.Errorf("%d refused connections: %d rows counting %d", refused, rows["refused"], counted["refused"])
	}
	if rows["ok"] != 1 || counted["ok"] != served || bytesOut != 4*served {
		t.Errorf("%d connections served: %d rows counting %d, %d bytes out", served, rows["ok"], counted["ok"], bytesOut)
	}
}
