package store

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a test's time, moved by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// sumCounts adds up the counts of the rows q selects, and says how many
// rows there are.
func sumCounts(t *testing.T, s *Store, q Query) (rows int, count int64) {
	t.Helper()
	q.Limit = 100000
	recs, err := s.Audit(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		count += r.Count
	}
	return len(recs), count
}

// A flood of refused connections, egress and to ports, is counted into
// one row per sandbox, destination and outcome a window, whose counts add
// up to the connections; past 64 destinations a sandbox's others share
// one row. Allowed egress connections keep a row each.
func TestAuditCountsRefusedConnections(t *testing.T) {
	s := open(t, t.TempDir())
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	audit := NewAuditLog(s, slog.New(slog.DiscardHandler), AuditOptions{CountWindow: time.Minute, Now: clk.Now})
	var ended []Record // as a cluster's node logs them
	audit.OnCounted(func(r Record) { ended = append(ended, r) })

	// 3000 refused egress connections to 3 destinations, from many
	// goroutines at once, as a sandbox's proxy reports them.
	var wg sync.WaitGroup
	for g := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				audit.Record(Record{Kind: "net", KeyID: "key_1", SandboxID: "sb_1", Status: "refused",
					Host: fmt.Sprintf("10.0.0.%d", (g+i)%3), Port: 80, Detail: "CONNECT a private address"})
			}
		}()
	}
	wg.Wait()
	// 1000 refused connections to 200 ports of another sandbox, as
	// anyone with its preview link can make.
	for i := range 1000 {
		audit.Record(Record{Kind: "port", KeyID: "key_1", SandboxID: "sb_2", Status: "refused", Port: 1000 + i%200})
	}
	// Allowed egress connections keep their own rows.
	for range 5 {
		audit.Record(Record{Kind: "net", KeyID: "key_1", SandboxID: "sb_1", Status: "allowed", Host: "example.com", Port: 443,
			BytesIn: 10})
	}
	// Connections to ports that worked are counted too, their bytes
	// added up.
	for range 7 {
		audit.Record(Record{Kind: "port", KeyID: "key_1", SandboxID: "sb_3", Status: "ok", Port: 8080, BytesIn: 100, BytesOut: 10})
	}
	// The next window starts new rows.
	clk.add(time.Minute)
	for range 50 {
		audit.Record(Record{Kind: "net", KeyID: "key_1", SandboxID: "sb_1", Status: "refused", Host: "10.0.0.0", Port: 80})
	}
	audit.Close()

	if rows, count := sumCounts(t, s, Query{Kind: "net", Status: "refused"}); rows != 4 || count != 3050 {
		t.Errorf("refused egress: %d rows counting %d connections, want 4 rows counting 3050", rows, count)
	}
	if rows, count := sumCounts(t, s, Query{Kind: "port", SandboxID: "sb_2"}); rows != maxRowsPerSandbox+1 || count != 1000 {
		t.Errorf("refused ports: %d rows counting %d connections, want %d rows counting 1000", rows, count, maxRowsPerSandbox+1)
	}
	others, err := s.Audit(context.Background(), Query{SandboxID: "sb_2", Limit: 1})
	if err != nil || len(others) != 1 || others[0].Host != OtherDestinations || others[0].Count != 1000-maxRowsPerSandbox*5 {
		t.Errorf("the row of other destinations: %+v %v", others, err)
	}
	if rows, count := sumCounts(t, s, Query{Kind: "net", Status: "allowed"}); rows != 5 || count != 5 {
		t.Errorf("allowed egress: %d rows counting %d, want 5 and 5", rows, count)
	}
	ok, err := s.Audit(context.Background(), Query{SandboxID: "sb_3"})
	if err != nil || len(ok) != 1 || ok[0].Count != 7 || ok[0].BytesIn != 700 || ok[0].BytesOut != 70 {
		t.Errorf("port connections: %+v %v", ok, err)
	}
	if st := audit.Stats(); st.Counted != 3050+1000+7-4-(maxRowsPerSandbox+1)-1 || st.Failing || st.Lost != 0 {
		t.Errorf("stats: %+v", st)
	}
	// Each counted row is told once, whole, when its window ends.
	var total, bytesIn int64
	for _, r := range ended {
		total += r.Count
		bytesIn += r.BytesIn
	}
	if len(ended) != 4+maxRowsPerSandbox+1+1 || total != 3050+1000+7 || bytesIn != 700 {
		t.Errorf("OnCounted was told of %d rows counting %d connections, %d bytes in", len(ended), total, bytesIn)
	}
}

// Retention deletes rows by age and past the newest MaxRows, through the
// store's API with explicit times, in batches.
func TestAuditPrune(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir())
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var recs []Record
	for i := range 1000 {
		recs = append(recs, Record{Time: t0.Add(time.Duration(i) * time.Hour), Kind: "execute", KeyID: "k", SandboxID: fmt.Sprint(i)})
	}
	if err := s.Append(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	// By age, 100 a batch: rows before hour 250 go.
	var deleted int64
	for {
		n, err := s.PruneAudit(ctx, Prune{Before: t0.Add(250 * time.Hour), Batch: 100})
		if err != nil {
			t.Fatal(err)
		}
		if n > 100 {
			t.Fatalf("a batch of 100 deleted %d", n)
		}
		deleted += n
		if n < 100 {
			break
		}
	}
	rows, _ := sumCounts(t, s, Query{})
	oldest, _ := s.Audit(ctx, Query{Until: t0.Add(251 * time.Hour), Limit: 10})
	if deleted != 250 || rows != 750 || len(oldest) != 1 || !oldest[0].Time.Equal(t0.Add(250*time.Hour)) {
		t.Fatalf("by age: deleted %d, %d rows left, oldest %+v", deleted, rows, oldest)
	}
	// By number: the newest 300 stay.
	for {
		n, err := s.PruneAudit(ctx, Prune{Keep: 300, Batch: 200})
		if err != nil {
			t.Fatal(err)
		}
		if n < 200 {
			break
		}
	}
	if rows, _ := sumCounts(t, s, Query{}); rows != 300 {
		t.Fatalf("by number: %d rows left, want 300", rows)
	}
	if got, _ := s.Audit(ctx, Query{Since: t0.Add(700 * time.Hour)}); len(got) != 100 {
		t.Fatalf("the newest 300 are not the ones kept: %d since hour 700", len(got))
	}
}

// A server's log prunes in the background what its options no longer
// keep, and gives the pages back: the database file shrinks once a flood
// has aged out.
func TestAuditLogRetention(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir)
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	audit := NewAuditLog(s, slog.New(slog.DiscardHandler), AuditOptions{Retention: 24 * time.Hour, MaxRows: 8000, Now: clk.Now})
	detail := strings.Repeat("x", 1000)
	var recs []Record
	for i := range 12000 {
		recs = append(recs, Record{Time: clk.Now().Add(time.Duration(i) * time.Second), Kind: "net", Status: "allowed",
			KeyID: "k", SandboxID: "sb", Host: "example.com", Port: 443, Detail: detail})
	}
	if err := s.Append(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	_, before, incremental, err := s.freePages(ctx)
	if err != nil || !incremental {
		t.Fatalf("a new database is not auto_vacuum=INCREMENTAL (%v)", err)
	}

	audit.prune() // by number: the newest 8000 stay
	if rows, _ := sumCounts(t, s, Query{}); rows != 8000 {
		t.Fatalf("%d rows after pruning to 8000", rows)
	}
	clk.add(24*time.Hour + 10000*time.Second) // rows of the first 10000 s are a day old
	audit.prune()
	if rows, _ := sumCounts(t, s, Query{}); rows != 2000 {
		t.Fatalf("%d rows after a day, want 2000", rows)
	}
	if st := audit.Stats(); st.Pruned != 10000 {
		t.Errorf("stats: %+v", st)
	}
	audit.Close() // and checkpoints: the file is cut to the pages in use
	free, after, _, err := s.freePages(ctx)
	if err != nil || after > before/2 || free > max(1024, after/4) {
		t.Errorf("the database had %d pages with every row, has %d (%d free) with a sixth of them (%v)", before, after, free, err)
	}
	fi, err := os.Stat(filepath.Join(dir, FileName))
	if err != nil || fi.Size() > before*4096/2 {
		t.Errorf("the database file has %d bytes; it had %d pages of 4096 with every row (%v)", fi.Size(), before, err)
	}
}
