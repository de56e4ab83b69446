package store

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"
)

// A record is in the database for another connection (the CLI's) to read
// as soon as Record returns, though its commit may still be under way: a
// request's answer, sent after, never runs ahead of its audit record.
// Concurrent records are committed together.
func TestAuditRecordIsCommittedWhenItReturns(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	server, cli := open(t, dir), open(t, dir)
	audit := NewAuditLog(server, slog.New(slog.DiscardHandler), AuditOptions{})
	defer audit.Close()

	// One at a time: each is readable at once.
	for i := range 20 {
		sb := fmt.Sprintf("sb_%d", i)
		audit.Record(Record{Kind: "execute", KeyID: "key_1", SandboxID: sb, Status: "ok"})
		got, err := cli.Audit(ctx, Query{SandboxID: sb})
		if err != nil || len(got) != 1 {
			t.Fatalf("record %d: %d records (%v) right after Record returned", i, len(got), err)
		}
	}
	// Many at once, as a busy server's requests: every one that has
	// returned is there.
	var wg sync.WaitGroup
	missing := make(chan string, 400)
	for i := range 400 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb := fmt.Sprintf("par_%d", i)
			audit.Record(Record{Kind: "execute", KeyID: "key_2", SandboxID: sb, Status: "ok"})
			if got, err := cli.Audit(ctx, Query{SandboxID: sb}); err != nil || len(got) != 1 {
				missing <- fmt.Sprintf("%s: %d records, %v", sb, len(got), err)
			}
		}()
	}
	wg.Wait()
	close(missing)
	for m := range missing {
		t.Error(m)
	}
	if got, _ := cli.Audit(ctx, Query{KeyID: "key_2", Limit: 1000}); len(got) != 400 {
		t.Fatalf("%d records of 400", len(got))
	}
}

// committed counts the audit rows committed, without waiting for a
// writer's open transaction as Store.Audit does.
func committed(t *testing.T, s *Store) int {
	t.Helper()
	var n int
	if err := s.db.QueryRow(`SELECT count(*) FROM audit`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Records that come one after another, as one client's executions sent
// back to back, share a transaction: the batch stays open for its
// linger, and Flush commits it without waiting for the rest.
func TestAuditBatchesRecordsThatComeOneAfterAnother(t *testing.T) {
	s := open(t, t.TempDir())
	audit := NewAuditLog(s, slog.New(slog.DiscardHandler), AuditOptions{Linger: time.Hour})
	defer audit.Close()
	for i := range 50 {
		audit.Record(Record{Kind: "execute", KeyID: "k", SandboxID: fmt.Sprintf("sb_%d", i)})
		if n := committed(t, s); n != 0 {
			t.Fatalf("after record %d: %d records committed before the batch's linger ended", i, n)
		}
	}
	audit.Flush()
	if n, commits := committed(t, s), audit.Stats().Commits; n != 50 || commits != 1 {
		t.Fatalf("after Flush: %d records of 50 committed, in %d transactions (want 1)", n, commits)
	}
}

// A full batch is committed without waiting for its linger, and records
// past it wait for room in the next: none is dropped.
func TestAuditFullBatchIsCommittedAtOnce(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	audit := NewAuditLog(s, slog.New(slog.DiscardHandler), AuditOptions{Linger: time.Hour})
	const n = maxBatch + 100
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			audit.Record(Record{Kind: "execute", KeyID: "k", SandboxID: fmt.Sprintf("sb_%d", i)})
		}()
	}
	wg.Wait() // every Record returned: those past the first batch found room
	if got := committed(t, s); got < maxBatch {
		t.Fatalf("%d records committed once all of %d were taken; a full batch holds %d", got, n, maxBatch)
	}
	audit.Close()
	if got := committed(t, s); got != n {
		t.Fatalf("%d records of %d after Close", got, n)
	}
}

// A commit that fails does not hang its callers, and the next records are
// written.
func TestAuditRecordReturnsWhenTheWriteFails(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	audit := NewAuditLog(s, slog.New(slog.DiscardHandler), AuditOptions{})
	defer audit.Close()
	if _, err := s.db.Exec(`CREATE TRIGGER refuse BEFORE INSERT ON audit WHEN NEW.kind = 'bad'
		BEGIN SELECT RAISE(ABORT, 'refused'); END`); err != nil {
		t.Fatal(err)
	}
	audit.Record(Record{Kind: "bad"}) // returns: the failure is logged
	audit.Record(Record{Kind: "execute", KeyID: "k"})
	if got, err := s.Audit(context.Background(), Query{}); err != nil || len(got) != 1 || got[0].Kind != "execute" {
		t.Fatalf("%+v %v", got, err)
	}
}

// What recording costs a request: one record at a time (an idle server),
// and many requests at once (records that arrive while a batch is written
// wait for the next transaction).
func BenchmarkAuditRecord(b *testing.B) {
	for _, parallel := range []int{1, 16} {
		b.Run(fmt.Sprintf("clients=%d", parallel*runtime.GOMAXPROCS(0)), func(b *testing.B) {
			s, err := Open(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			audit := NewAuditLog(s, slog.New(slog.DiscardHandler), AuditOptions{})
			defer audit.Close()
			b.SetParallelism(parallel)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					audit.Record(Record{Kind: "execute", KeyID: "key_1", SandboxID: "sb_1", Status: "ok", CodeSHA256: CodeHash("x")})
				}
			})
		})
	}
}

// What a batch's transaction costs, by the records it holds: its BEGIN
// and COMMIT are paid once, each record's insert once per record.
func BenchmarkAuditTransaction(b *testing.B) {
	s, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	w := writer{st: s}
	defer w.close()
	ctx := context.Background()
	for _, n := range []int{1, 3, 10} {
		recs := make([]Record, n)
		for i := range recs {
			recs[i] = Record{Kind: "execute", KeyID: "key_1", SandboxID: "sb_1", Status: "ok", CodeSHA256: CodeHash("x")}
		}
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			for range b.N {
				if err := w.begin(ctx); err != nil {
					b.Fatal(err)
				}
				if _, _, err := w.commit(ctx, recs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/record")
		})
	}
}

// Commits do not checkpoint (that would put an fsync in some request's
// path); the log does it in the background and when it closes, so the
// write-ahead log is copied into the database file.
func TestAuditLogCheckpoints(t *testing.T) {
	s := open(t, t.TempDir())
	audit := NewAuditLog(s, slog.New(slog.DiscardHandler), AuditOptions{})
	for range 50 {
		audit.Record(Record{Kind: "execute", KeyID: "k"})
	}
	var busy, logFrames, done int
	// Nothing checkpointed yet by a commit: the log holds every frame.
	if err := s.db.QueryRow(`PRAGMA wal_checkpoint(NOOP)`).Scan(&busy, &logFrames, &done); err != nil {
		t.Fatal(err)
	}
	if logFrames == 0 || done != 0 {
		t.Fatalf("before the log's checkpoint: %d frames in the log, %d checkpointed", logFrames, done)
	}
	audit.Close()
	if err := s.db.QueryRow(`PRAGMA wal_checkpoint(NOOP)`).Scan(&busy, &logFrames, &done); err != nil {
		t.Fatal(err)
	}
	if done != logFrames {
		t.Fatalf("after Close: %d frames in the log, %d checkpointed", logFrames, done)
	}
	audit.Close() // twice is harmless
}

// Close writes every record Record has taken: a server that stops loses
// none of them, though their commits were not waited for, and does not
// wait for the open batch's linger.
func TestAuditLogCloseWritesWhatItTook(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	audit := NewAuditLog(s, slog.New(slog.DiscardHandler), AuditOptions{Linger: time.Hour})
	var wg sync.WaitGroup
	for i := range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			audit.Record(Record{Kind: "execute", KeyID: "k", SandboxID: fmt.Sprintf("sb_%d", i)})
		}()
	}
	wg.Wait()
	audit.Close()
	s.Close()
	after := open(t, dir)
	if got, err := after.Audit(context.Background(), Query{KeyID: "k", Limit: 1000}); err != nil || len(got) != 300 {
		t.Fatalf("%d records of 300 after Close (%v)", len(got), err)
	}
}
