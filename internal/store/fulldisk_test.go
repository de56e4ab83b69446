package store

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// On a full disk, a record's write fails, Record returns all the same,
// and the failure is counted and logged once, not once a record; when
// room is made, records are written again and that is said too. Each
// record is flushed: its own batch, as on a quiet server.
func TestAuditLogOnAFullDisk(t *testing.T) {
	dir := testutil.SmallFS(t, 4<<20)
	s := open(t, dir)
	var logged testutil.Buffer
	audit := NewAuditLog(s, slog.New(slog.NewTextHandler(&logged, nil)), AuditOptions{})
	defer audit.Close()
	audit.Record(Record{Kind: "execute", KeyID: "k", SandboxID: "before"})

	free := testutil.FillFS(t, dir)
	// The log file has room for a few commits where it was written
	// before; the disk then refuses the next.
	code := strings.Repeat("x", 4000)
	var tries int
	for tries = 1; tries <= 5000 && !audit.Stats().Failing; tries++ {
		audit.Record(Record{Kind: "execute", KeyID: "k", SandboxID: "full", CodeSHA256: CodeHash(code), Detail: code})
		audit.Flush()
	}
	for range 100 {
		audit.Record(Record{Kind: "execute", KeyID: "k", SandboxID: "full"})
		audit.Flush()
	}
	st := audit.Stats()
	if !st.Failing || st.WriteFailures < 100 || st.Lost < 100 {
		t.Fatalf("after %d records on a full disk: %+v", tries, st)
	}
	t.Logf("the disk refused record %d; then %+v", tries, st)
	if n := strings.Count(logged.String(), "audit log write failed"); n != 1 {
		t.Errorf("%d log lines for %d failures, want 1:\n%s", n, st.WriteFailures, logged.String())
	}
	if !strings.Contains(logged.String(), "disk_full=true") {
		t.Errorf("the log does not say the disk is full:\n%s", logged.String())
	}

	free()
	audit.Record(Record{Kind: "execute", KeyID: "k", SandboxID: "after"})
	audit.Flush()
	if st := audit.Stats(); st.Failing {
		t.Errorf("still failing once the disk has room: %+v", st)
	}
	if got, err := s.Audit(context.Background(), Query{SandboxID: "after"}); err != nil || len(got) != 1 {
		t.Errorf("the record after: %v %v", got, err)
	}
	if !strings.Contains(logged.String(), "audit log writes succeed again") {
		t.Errorf("the recovery is not logged:\n%s", logged.String())
	}
}
