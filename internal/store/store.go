// Package store keeps what a server must remember across restarts in one
// embedded SQLite database (a pure-Go driver, no cgo): API keys, stored as
// SHA-256 hashes only, and the audit log of executions and connections,
// which a server's AuditLog keeps within its retention (auditlog.go) and
// whose floods of refused connections it counts (auditcount.go).
//
// The database is opened in WAL mode with a busy timeout, so the CLI
// (`vivarium keys`, `vivarium audit`) can use it while a server runs.
package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Errors of the store.
var (
	ErrNotFound   = errors.New("not found")
	ErrInvalidKey = errors.New("invalid API key")
)

// FileName is the database's name in a data directory.
const FileName = "vivarium.db"

// Store is an open database.
type Store struct {
	db          *sql.DB
	insertAudit *sql.Stmt // prepared once: every request's record uses it
	// waiting lets one reader of the audit log at a time wait for a
	// server's writer (waitForWriters): a process's many readers (a
	// test's hundreds) do not all take turns at SQLite's write lock,
	// whose waiters sleep between tries, with the server's writer.
	waiting sync.Mutex
}

const schema = `
CREATE TABLE IF NOT EXISTS keys (
	id             TEXT PRIMARY KEY,
	name           TEXT NOT NULL,
	hash           TEXT NOT NULL UNIQUE,
	created_at     INTEGER NOT NULL,
	revoked_at     INTEGER,
	max_sandboxes  INTEGER NOT NULL DEFAULT 0,
	max_executions INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS audit (
	seq               INTEGER PRIMARY KEY AUTOINCREMENT,
	time              INTEGER NOT NULL,
	kind              TEXT NOT NULL,
	key_id            TEXT NOT NULL,
	sandbox_id        TEXT NOT NULL,
	code_sha256       TEXT NOT NULL,
	status            TEXT NOT NULL,
	exit_code         INTEGER NOT NULL,
	duration_ms       REAL NOT NULL,
	cpu_ms            REAL NOT NULL,
	peak_memory_bytes INTEGER NOT NULL,
	detail            TEXT NOT NULL DEFAULT '',
	host              TEXT NOT NULL DEFAULT '',
	port              INTEGER NOT NULL DEFAULT 0,
	bytes_in          INTEGER NOT NULL DEFAULT 0,
	bytes_out         INTEGER NOT NULL DEFAULT 0,
	count             INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS audit_time ON audit(time);
CREATE INDEX IF NOT EXISTS audit_key ON audit(key_id, time);
CREATE INDEX IF NOT EXISTS audit_sandbox ON audit(sandbox_id, time);
`

// Open opens (creating if needed) the database in dir, which is created
// with mode 0711: others may pass through it but not list it (a paused
// sandbox's restore reads its checkpoint below it, as the sandbox's own
// host user); the database in it, key hashes and the record of every
// execution, is 0600.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	path := filepath.Join(dir, FileName)
	// Create the file with tight permissions before SQLite does.
	if f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		return nil, fmt.Errorf("database: %w", err)
	} else {
		f.Close()
	}
	// WAL: readers (the CLI) and the server's writes do not block each
	// other. synchronous(NORMAL): a commit is in the log file when it
	// returns, safe from a crash of the process (not from one of the
	// machine). No automatic checkpoint: it would run, with its fsync,
	// inside whichever request's commit crossed the threshold; a server
	// checkpoints in the background (AuditLog), and the last connection
	// to close checkpoints too. journal_size_limit: the log file is cut
	// back to 64 MiB when it is reset after a burst of writes, not left
	// at its largest.
	dsn := "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)" +
		"&_pragma=synchronous(NORMAL)&_pragma=wal_autocheckpoint(0)&_pragma=journal_size_limit(67108864)"
	if err := create(path); err != nil {
		return nil, fmt.Errorf("database %s: %w", path, err)
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	if err := migrate(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("database %s: %w", path, err)
	}
	insert, err := db.Prepare(insertAuditSQL)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("database %s: %w", path, err)
	}
	return &Store{db: db, insertAudit: insert}, nil
}

// create makes the tables that are missing, on a connection of its own.
// auto_vacuum(INCREMENTAL) takes effect only on a new database (before its
// first table, and before WAL mode is written into its header), so this
// connection sets it first: the audit log's pruning then gives the pages
// it frees back to the file system (AuditLog.vacuum); an older database
// keeps its pages for reuse. The pool's connections do not set it:
// setting it takes SQLite's write lock, which a new connection would
// then wait for while a server's batch of audit records is open
// (AuditLog).
func create(path string) error {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=auto_vacuum(INCREMENTAL)&_pragma=journal_mode(WAL)")
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.Exec(schema)
	return err
}

const insertAuditSQL = `INSERT INTO audit (time, kind, key_id, sandbox_id, code_sha256, status,
	exit_code, duration_ms, cpu_ms, peak_memory_bytes, detail, host, port, bytes_in, bytes_out, count)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// addedColumns are columns added to a table after its first release: a
// database made by an older server gets them on open.
var addedColumns = []struct{ table, column, def string }{
	{"audit", "host", "TEXT NOT NULL DEFAULT ''"},
	{"audit", "port", "INTEGER NOT NULL DEFAULT 0"},
	{"audit", "bytes_in", "INTEGER NOT NULL DEFAULT 0"},
	{"audit", "bytes_out", "INTEGER NOT NULL DEFAULT 0"},
	{"audit", "count", "INTEGER NOT NULL DEFAULT 1"},
	{"keys", "close_sandboxes", "INTEGER NOT NULL DEFAULT 0"},
}

func migrate(db *sql.DB) error {
	for _, c := range addedColumns {
		var n int
		err := db.QueryRow(`SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?`, c.table, c.column).Scan(&n)
		if err != nil {
			return err
		}
		if n == 0 {
			if _, err := db.Exec(fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s %s", c.table, c.column, c.def)); err != nil {
				return err
			}
		}
	}
	return nil
}

// Checkpoint copies what the write-ahead log holds into the database file,
// as far as readers let it, without waiting for them.
func (s *Store) Checkpoint(ctx context.Context) error {
	_, err := s.db.ExecContext(ctx, `PRAGMA wal_checkpoint(PASSIVE)`)
	return err
}

// Close closes the database.
func (s *Store) Close() error {
	s.insertAudit.Close()
	return s.db.Close()
}

// Key is an API key's record. The token itself is never stored.
type Key struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	// CloseSandboxes: revoked with its sandboxes, which servers close.
	CloseSandboxes bool `json:"close_sandboxes,omitempty"`
	// Per-key quotas; zero means the server's default.
	MaxSandboxes  int `json:"max_sandboxes"`
	MaxExecutions int `json:"max_executions"`
}

// TokenPrefix starts every new API key: E2B's format ("e2b_" and 40 hex
// digits, 160 random bits), which E2B's SDKs check before they send a key,
// so that a Vivarium key works with them unchanged; secret scanners find
// leaked ones as they find E2B's.
const TokenPrefix = "e2b_"

// legacyTokenPrefix starts the keys servers made before: they keep working.
const legacyTokenPrefix = "viv_"

// tokenBytes is the random part of a new key: 20 bytes, 40 hex digits.
const tokenBytes = 20

// CreateKey makes a new key and returns its token, shown once.
func (s *Store) CreateKey(ctx context.Context, name string, maxSandboxes, maxExecutions int) (string, Key, error) {
	if name == "" || len(name) > 200 {
		return "", Key{}, errors.New("a key needs a name of 1 to 200 characters")
	}
	if maxSandboxes < 0 || maxExecutions < 0 {
		return "", Key{}, errors.New("quotas cannot be negative")
	}
	secret := make([]byte, tokenBytes)
	rand.Read(secret)
	token := TokenPrefix + hex.EncodeToString(secret)
	id := make([]byte, 6)
	rand.Read(id)
	k := Key{ID: "key_" + hex.EncodeToString(id), Name: name, CreatedAt: time.Now().UTC().Truncate(time.Second),
		MaxSandboxes: maxSandboxes, MaxExecutions: maxExecutions}
	_, err := s.db.ExecContext(ctx,
		`INSERT INTO keys (id, name, hash, created_at, max_sandboxes, max_executions) VALUES (?, ?, ?, ?, ?, ?)`,
		k.ID, k.Name, hashToken(token), k.CreatedAt.Unix(), maxSandboxes, maxExecutions)
	if err != nil {
		return "", Key{}, err
	}
	return token, k, nil
}

// hashToken is the stored form of a token. Tokens carry 160 random bits
// (256 for legacy ones), so a fast hash is enough: there is nothing to
// brute-force.
func hashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// Lookup returns the live key a token belongs to.
func (s *Store) Lookup(ctx context.Context, token string) (Key, error) {
	if !(strings.HasPrefix(token, TokenPrefix) || strings.HasPrefix(token, legacyTokenPrefix)) || len(token) > 200 {
		return Key{}, ErrInvalidKey
	}
	want := hashToken(token)
	row := s.db.QueryRowContext(ctx, `SELECT id, name, hash, created_at, revoked_at, max_sandboxes, max_executions, close_sandboxes
		FROM keys WHERE hash = ?`, want)
	k, hash, err := scanKey(row)
	if errors.Is(err, sql.ErrNoRows) {
		return Key{}, ErrInvalidKey
	}
	if err != nil {
		return Key{}, err
	}
	if subtle.ConstantTimeCompare([]byte(hash), []byte(want)) != 1 || k.RevokedAt != nil {
		return Key{}, ErrInvalidKey
	}
	return k, nil
}

type scanner interface{ Scan(...any) error }

func scanKey(row scanner) (Key, string, error) {
	var k Key
	var hash string
	var created int64
	var revoked sql.NullInt64
	if err := row.Scan(&k.ID, &k.Name, &hash, &created, &revoked, &k.MaxSandboxes, &k.MaxExecutions, &k.CloseSandboxes); err != nil {
		return Key{}, "", err
	}
	k.CreatedAt = time.Unix(created, 0).UTC()
	if revoked.Valid {
		t := time.Unix(revoked.Int64, 0).UTC()
		k.RevokedAt = &t
	}
	return k, hash, nil
}

// Keys lists every key, oldest first.
func (s *Store) Keys(ctx context.Context) ([]Key, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, name, hash, created_at, revoked_at, max_sandboxes, max_executions, close_sandboxes
		FROM keys ORDER BY created_at, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Key
	for rows.Next() {
		k, _, err := scanKey(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// CountKeys is the number of keys that are not revoked.
func (s *Store) CountKeys(ctx context.Context) (int, error) {
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM keys WHERE revoked_at IS NULL`).Scan(&n)
	return n, err
}

// RevokeKey revokes a live key, named by id or by name; its token and
// every token derived from it stop working at once (servers cache a
// lookup for at most a few seconds). With closeSandboxes, servers close
// the key's sandboxes too; a key already revoked, named by id, may be
// given that still.
func (s *Store) RevokeKey(ctx context.Context, idOrName string, closeSandboxes bool) (Key, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, name, hash, created_at, revoked_at, max_sandboxes, max_executions, close_sandboxes
		FROM keys WHERE (id = ? OR name = ?) AND (revoked_at IS NULL OR (id = ? AND ?))`, idOrName, idOrName, idOrName, closeSandboxes)
	if err != nil {
		return Key{}, err
	}
	var found []Key
	for rows.Next() {
		k, _, err := scanKey(rows)
		if err != nil {
			rows.Close()
			return Key{}, err
		}
		found = append(found, k)
	}
	rows.Close()
	switch {
	case len(found) == 0:
		return Key{}, fmt.Errorf("%w: no live key with id or name %q", ErrNotFound, idOrName)
	case len(found) > 1:
		return Key{}, fmt.Errorf("%d live keys are named %q: revoke one by its id", len(found), idOrName)
	}
	k := found[0]
	if k.RevokedAt == nil {
		now := time.Now().UTC().Truncate(time.Second)
		k.RevokedAt = &now
	}
	k.CloseSandboxes = k.CloseSandboxes || closeSandboxes
	if _, err := s.db.ExecContext(ctx, `UPDATE keys SET revoked_at = ?, close_sandboxes = ? WHERE id = ?`,
		k.RevokedAt.Unix(), k.CloseSandboxes, k.ID); err != nil {
		return Key{}, err
	}
	return k, nil
}

// KeyState returns whether the key id is revoked (or is no key), and
// whether its sandboxes are to be closed with it.
func (s *Store) KeyState(ctx context.Context, id string) (revoked, closeSandboxes bool, err error) {
	var at sql.NullInt64
	err = s.db.QueryRowContext(ctx, `SELECT revoked_at, close_sandboxes FROM keys WHERE id = ?`, id).Scan(&at, &closeSandboxes)
	if errors.Is(err, sql.ErrNoRows) {
		return true, false, nil
	}
	if err != nil {
		return false, false, err
	}
	return at.Valid, at.Valid && closeSandboxes, nil
}
