package store

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"
)

// A network connection's record keeps its destination and bytes.
func TestAuditNetRecords(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir())
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	want := Record{Time: t0, Kind: "net", KeyID: "key_1", SandboxID: "sb_1", Status: "allowed",
		Detail: "CONNECT via 93.184.215.14:443", Host: "example.com", Port: 443, BytesIn: 5000, BytesOut: 700, DurationMS: 12, Count: 1}
	if err := s.Append(ctx, want, Record{Time: t0, Kind: "net", KeyID: "key_1", SandboxID: "sb_1", Status: "refused",
		Host: "169.254.169.254", Port: 80, Detail: "always refused"}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Audit(ctx, Query{Kind: "net", Status: "allowed"})
	if err != nil || len(got) != 1 {
		t.Fatalf("%v %v", got, err)
	}
	want.Seq = got[0].Seq
	if got[0] != want {
		t.Errorf("got %+v\nwant %+v", got[0], want)
	}
}

// A database an older server made gets the new columns on open, and
// keeps its records.
func TestAuditMigration(t *testing.T) {
	dir := t.TempDir()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, time INTEGER NOT NULL,
		kind TEXT NOT NULL, key_id TEXT NOT NULL, sandbox_id TEXT NOT NULL, code_sha256 TEXT NOT NULL, status TEXT NOT NULL,
		exit_code INTEGER NOT NULL, duration_ms REAL NOT NULL, cpu_ms REAL NOT NULL, peak_memory_bytes INTEGER NOT NULL,
		detail TEXT NOT NULL DEFAULT '');
		INSERT INTO audit (time, kind, key_id, sandbox_id, code_sha256, status, exit_code, duration_ms, cpu_ms, peak_memory_bytes)
		VALUES (1, 'execute', 'k', 's', 'c', 'ok', 0, 1, 1, 1)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s := open(t, dir)
	ctx := context.Background()
	if err := s.Append(ctx, Record{Kind: "net", KeyID: "k", Status: "refused", Host: "evil.test", Port: 80}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Audit(ctx, Query{})
	if err != nil || len(got) != 2 || got[0].Host != "evil.test" || got[1].Kind != "execute" || got[1].Count != 1 {
		t.Fatalf("%+v %v", got, err)
	}
	s.Close()
	open(t, dir) // a second open finds the columns there
}
