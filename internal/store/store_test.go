package store

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestKeysAreHashedAndRevocable(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir)
	token, k, err := s.CreateKey(ctx, "alice", 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(token) {
		t.Fatalf("token %q: not E2B's format, which its SDKs check", token)
	}
	got, err := s.Lookup(ctx, token)
	if err != nil || got.ID != k.ID || got.MaxSandboxes != 3 || got.MaxExecutions != 1 {
		t.Fatalf("lookup: %+v %v", got, err)
	}
	for _, bad := range []string{"", "viv_", "e2b_", token + "x", token[:len(token)-1], "Bearer " + token, strings.ToUpper(token)} {
		if _, err := s.Lookup(ctx, bad); err != ErrInvalidKey {
			t.Errorf("lookup %q: %v", bad, err)
		}
	}
	// The token is nowhere in the database file; its hash is.
	s.Close()
	raw, _ := os.ReadFile(filepath.Join(dir, FileName))
	wal, _ := os.ReadFile(filepath.Join(dir, FileName+"-wal"))
	if strings.Contains(string(raw)+string(wal), token[len(TokenPrefix):]) {
		t.Fatal("the token is stored in clear")
	}
	if fi, err := os.Stat(filepath.Join(dir, FileName)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("database mode: %v %v", fi.Mode(), err)
	}
	s = open(t, dir)
	if _, err := s.Lookup(ctx, token); err != nil {
		t.Fatalf("after reopening: %v", err)
	}
	if _, err := s.RevokeKey(ctx, "alice", false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup(ctx, token); err != ErrInvalidKey {
		t.Fatalf("revoked key still works: %v", err)
	}
	if _, err := s.RevokeKey(ctx, "alice", false); err == nil {
		t.Fatal("revoked twice")
	}
	if n, _ := s.CountKeys(ctx); n != 0 {
		t.Fatalf("%d live keys", n)
	}
	keys, _ := s.Keys(ctx)
	if len(keys) != 1 || keys[0].RevokedAt == nil {
		t.Fatalf("keys %+v", keys)
	}
	if _, _, err := s.CreateKey(ctx, "", 0, 0); err == nil {
		t.Fatal("a key without a name")
	}
}

// A key's state: live; revoked; revoked with its sandboxes, which a key
// revoked before may be given by its id (not by its name); no key at all
// is revoked. The keyring answers the same, and Revoke takes effect on
// its own lookups at once.
func TestKeyState(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir())
	_, a, _ := s.CreateKey(ctx, "a", 0, 0)
	token, b, _ := s.CreateKey(ctx, "b", 0, 0)
	ring := NewKeyring(s, time.Hour)
	state := func(id string) [2]bool {
		r, c, err := s.KeyState(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if rr, rc := NewKeyring(s, time.Hour).Revoked(id); rr != r || rc != c {
			t.Errorf("the keyring says %v %v, the store %v %v", rr, rc, r, c)
		}
		return [2]bool{r, c}
	}
	if got := state(a.ID); got != [2]bool{false, false} {
		t.Fatalf("a live key: %v", got)
	}
	if got := state("key_nothing"); got != [2]bool{true, false} {
		t.Fatalf("no key: %v", got)
	}
	if _, err := s.RevokeKey(ctx, "a", false); err != nil {
		t.Fatal(err)
	}
	if got := state(a.ID); got != [2]bool{true, false} {
		t.Fatalf("revoked: %v", got)
	}
	if _, err := s.RevokeKey(ctx, "a", true); err == nil {
		t.Fatal("a revoked key given its sandboxes by name")
	}
	k, err := s.RevokeKey(ctx, a.ID, true)
	if err != nil || !k.CloseSandboxes {
		t.Fatalf("a revoked key given its sandboxes by id: %+v %v", k, err)
	}
	if got := state(a.ID); got != [2]bool{true, true} {
		t.Fatalf("revoked with its sandboxes: %v", got)
	}
	// The keyring's own Revoke: its cached lookups end at once.
	if owner, err := ring.Owner(token); err != nil || owner != b.ID {
		t.Fatal(owner, err)
	}
	if r, _ := ring.Revoked(b.ID); r {
		t.Fatal("a live key is revoked")
	}
	if err := ring.Revoke(b.ID, true); err != nil {
		t.Fatal(err)
	}
	if _, err := ring.Owner(token); err != ErrInvalidKey {
		t.Fatalf("a revoked key's token, cached before: %v", err)
	}
	if r, c := ring.Revoked(b.ID); !r || !c {
		t.Fatalf("after Revoke: %v %v", r, c)
	}
}

func TestRevokeAmbiguousName(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir())
	s.CreateKey(ctx, "ci", 0, 0)
	_, k2, _ := s.CreateKey(ctx, "ci", 0, 0)
	if _, err := s.RevokeKey(ctx, "ci", false); err == nil || !strings.Contains(err.Error(), "by its id") {
		t.Fatalf("ambiguous revoke: %v", err)
	}
	if _, err := s.RevokeKey(ctx, k2.ID, false); err != nil {
		t.Fatal(err)
	}
}

// The CLI opens the database while a server holds it open.
func TestTwoProcessesShareTheDatabase(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	server, cli := open(t, dir), open(t, dir)
	token, _, err := cli.CreateKey(ctx, "bob", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	ring := NewKeyring(server, time.Hour)
	if _, err := ring.Owner(token); err != nil {
		t.Fatal(err)
	}
	if _, err := ring.Owner("viv_nope"); err != ErrInvalidKey {
		t.Fatal(err)
	}
	audit := NewAuditLog(server, slog.New(slog.DiscardHandler), AuditOptions{})
	for i := range 300 {
		audit.Record(Record{Kind: "execute", KeyID: "key_1", SandboxID: "sb_1", Status: "ok", ExitCode: i % 2})
	}
	audit.Close()
	recs, err := cli.Audit(ctx, Query{KeyID: "key_1", Limit: 1000})
	if err != nil || len(recs) != 300 {
		t.Fatalf("%d records, %v", len(recs), err)
	}
}

func TestAuditQuery(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir())
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	recs := []Record{
		{Time: t0, Kind: "execute", KeyID: "a", SandboxID: "s1", CodeSHA256: CodeHash("x = 1"), Status: "ok", DurationMS: 1.5, CPUMS: 1, PeakMemoryBytes: 10},
		{Time: t0.Add(time.Minute), Kind: "execute", KeyID: "a", SandboxID: "s1", Status: "error", ExitCode: 1},
		{Time: t0.Add(2 * time.Minute), Kind: "command", KeyID: "b", SandboxID: "s2", Status: "timeout", ExitCode: 124},
	}
	if err := s.Append(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		q    Query
		want int
	}{
		{Query{}, 3}, {Query{KeyID: "a"}, 2}, {Query{SandboxID: "s2"}, 1}, {Query{Status: "error"}, 1},
		{Query{Kind: "command"}, 1}, {Query{Since: t0.Add(time.Minute)}, 2}, {Query{Until: t0.Add(time.Minute)}, 1},
		{Query{Limit: 1}, 1}, {Query{KeyID: "a", Status: "timeout"}, 0},
	} {
		got, err := s.Audit(ctx, c.q)
		if err != nil || len(got) != c.want {
			t.Errorf("%+v: %d records (%v), want %d", c.q, len(got), err, c.want)
		}
	}
	got, _ := s.Audit(ctx, Query{})
	if got[0].Kind != "command" || got[2].CodeSHA256 != CodeHash("x = 1") || got[2].DurationMS != 1.5 || !got[2].Time.Equal(t0) {
		t.Fatalf("records %+v", got)
	}
}

// A key made by an older server (viv_ and base64) keeps working.
func TestLegacyKeysStillWork(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir())
	legacy := "viv_" + strings.Repeat("A", 43)
	if _, err := s.db.ExecContext(ctx, `INSERT INTO keys (id, name, hash, created_at) VALUES ('key_old', 'old', ?, 0)`,
		hashToken(legacy)); err != nil {
		t.Fatal(err)
	}
	if k, err := s.Lookup(ctx, legacy); err != nil || k.ID != "key_old" {
		t.Fatalf("legacy key: %+v %v", k, err)
	}
	if _, err := s.Lookup(ctx, "e2b_"+legacy[4:]); err != ErrInvalidKey {
		t.Fatalf("the legacy secret under the new prefix: %v", err)
	}
}
