package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// Record is one entry of the audit log: an execution, a command or a
// one-shot run, and what it cost; or a sandbox's network connection
// (Kind "net", Status "allowed", "refused" or "failed", Detail the
// reason), with its destination and bytes; or a connection to a
// sandbox's port from outside (Kind "port").
//
// A row may stand for several connections (Count): the audit log counts
// connections that anyone can repeat at no cost (see AuditLog) into one
// row per sandbox, destination and outcome per window, whose bytes and
// duration are then the sums of its connections'.
type Record struct {
	Seq             int64     `json:"seq"`
	Time            time.Time `json:"time"`
	Kind            string    `json:"kind"` // "execute", "command", "run_once"
	KeyID           string    `json:"key_id"`
	SandboxID       string    `json:"sandbox_id"`
	CodeSHA256      string    `json:"code_sha256"`
	Status          string    `json:"status"`
	ExitCode        int       `json:"exit_code"`
	DurationMS      float64   `json:"duration_ms"`
	CPUMS           float64   `json:"cpu_ms"`
	PeakMemoryBytes int64     `json:"peak_memory_bytes"`
	Detail          string    `json:"detail,omitempty"`
	// Network connections only: where to, and the bytes from there
	// (in) and to there (out).
	Host     string `json:"host,omitempty"`
	Port     int    `json:"port,omitempty"`
	BytesIn  int64  `json:"bytes_in,omitempty"`
	BytesOut int64  `json:"bytes_out,omitempty"`
	// Count is how many connections the row stands for: 1 but for
	// counted rows; zero is taken as 1 when written.
	Count int64 `json:"count"`
}

// CodeHash is how the audit log identifies code without keeping it.
func CodeHash(code string) string {
	h := sha256.Sum256([]byte(code))
	return hex.EncodeToString(h[:])
}

// Append adds records in one transaction.
func (s *Store) Append(ctx context.Context, recs ...Record) error {
	_, err := s.appendRows(ctx, recs)
	return err
}

// appendRows adds records in one transaction and returns their seqs. One
// record, a request's on a quiet server, is its INSERT alone, which
// SQLite commits as it ends: BEGIN and COMMIT would be two more
// statements through database/sql for the same commit.
func (s *Store) appendRows(ctx context.Context, recs []Record) ([]int64, error) {
	if len(recs) == 0 {
		return nil, nil
	}
	if len(recs) == 1 {
		seq, err := insertRecord(ctx, s.insertAudit, recs[0])
		if err != nil {
			return nil, err
		}
		return []int64{seq}, nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	stmt := tx.StmtContext(ctx, s.insertAudit)
	defer stmt.Close()
	seqs := make([]int64, len(recs))
	for i, r := range recs {
		if seqs[i], err = insertRecord(ctx, stmt, r); err != nil {
			return nil, err
		}
	}
	return seqs, tx.Commit()
}

// insertRecord inserts r with stmt (the prepared insertAudit) and returns
// its seq.
func insertRecord(ctx context.Context, stmt *sql.Stmt, r Record) (int64, error) {
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	res, err := stmt.ExecContext(ctx, r.Time.UnixMicro(), r.Kind, r.KeyID, r.SandboxID, r.CodeSHA256, r.Status,
		r.ExitCode, r.DurationMS, r.CPUMS, r.PeakMemoryBytes, r.Detail, r.Host, r.Port, r.BytesIn, r.BytesOut, max(r.Count, 1))
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

// rowAdd is what a counted row gains: more connections, their bytes
// and their time.
type rowAdd struct {
	seq               int64
	count             int64
	bytesIn, bytesOut int64
	durationMS        float64
}

// addToRows adds to counted rows, in one transaction. A row that
// retention has deleted meanwhile gains nothing.
func (s *Store) addToRows(ctx context.Context, adds []rowAdd) error {
	if len(adds) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, `UPDATE audit SET count = count + ?, bytes_in = bytes_in + ?,
		bytes_out = bytes_out + ?, duration_ms = duration_ms + ? WHERE seq = ?`)
	if err != nil {
		return err
	}
	defer stmt.Close()
	for _, a := range adds {
		if _, err := stmt.ExecContext(ctx, a.count, a.bytesIn, a.bytesOut, a.durationMS, a.seq); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// Prune says which audit rows PruneAudit deletes.
type Prune struct {
	// Before: rows whose time is before it; zero: none by age.
	Before time.Time
	// Keep: every row but the newest Keep; zero: none by number.
	Keep int64
	// Batch: at most this many rows in one call (one transaction);
	// zero: 500.
	Batch int
}

// PruneAudit deletes at most p.Batch of the audit rows that p names, the
// oldest first, in one short transaction, and returns how many it
// deleted: fewer than p.Batch when none is left. Rows are numbered in
// the order they were written, so keeping the newest Keep is "every seq
// above the newest one's less Keep", found through the table's own key
// (no count of the table); rows past their age are found through the
// time index.
func (s *Store) PruneAudit(ctx context.Context, p Prune) (int64, error) {
	if p.Batch <= 0 {
		p.Batch = 500
	}
	var n int64
	if p.Keep > 0 {
		res, err := s.db.ExecContext(ctx, `DELETE FROM audit WHERE seq IN (SELECT seq FROM audit
			WHERE seq <= (SELECT max(seq) FROM audit) - ? ORDER BY seq LIMIT ?)`, p.Keep, p.Batch)
		if err != nil {
			return 0, err
		}
		n, _ = res.RowsAffected()
	}
	if !p.Before.IsZero() && n < int64(p.Batch) {
		res, err := s.db.ExecContext(ctx, `DELETE FROM audit WHERE seq IN (SELECT seq FROM audit
			WHERE time < ? ORDER BY time LIMIT ?)`, p.Before.UnixMicro(), int64(p.Batch)-n)
		if err != nil {
			return n, err
		}
		m, _ := res.RowsAffected()
		n += m
	}
	return n, nil
}

// freePages is how many pages of the database file are free, and how
// many it has; incremental is whether it can give free pages back
// (auto_vacuum=INCREMENTAL, databases made since it was set).
func (s *Store) freePages(ctx context.Context) (free, total int64, incremental bool, err error) {
	var mode int
	if err = s.db.QueryRowContext(ctx, `PRAGMA auto_vacuum`).Scan(&mode); err != nil {
		return
	}
	if err = s.db.QueryRowContext(ctx, `PRAGMA freelist_count`).Scan(&free); err != nil {
		return
	}
	err = s.db.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&total)
	return free, total, mode == 2, err
}

// vacuum gives at most pages free pages back to the file system (the
// file shrinks), in one short transaction.
func (s *Store) vacuum(ctx context.Context, pages int64) error {
	_, err := s.db.ExecContext(ctx, fmt.Sprintf(`PRAGMA incremental_vacuum(%d)`, pages))
	return err
}

// Query selects audit records. Zero fields do not filter.
type Query struct {
	KeyID     string
	SandboxID string
	Status    string
	Kind      string
	Since     time.Time
	Until     time.Time
	Limit     int // default 100, at most 100000
}

// Audit returns the records that match q, newest first: every record
// whose request has been answered, though its commit may not have ended
// when the answer was sent (AuditLog).
func (s *Store) Audit(ctx context.Context, q Query) ([]Record, error) {
	var where []string
	var args []any
	add := func(cond string, v any) {
		where = append(where, cond)
		args = append(args, v)
	}
	if q.KeyID != "" {
		add("key_id = ?", q.KeyID)
	}
	if q.SandboxID != "" {
		add("sandbox_id = ?", q.SandboxID)
	}
	if q.Status != "" {
		add("status = ?", q.Status)
	}
	if q.Kind != "" {
		add("kind = ?", q.Kind)
	}
	if !q.Since.IsZero() {
		add("time >= ?", q.Since.UnixMicro())
	}
	if !q.Until.IsZero() {
		add("time < ?", q.Until.UnixMicro())
	}
	switch {
	case q.Limit <= 0:
		q.Limit = 100
	case q.Limit > 100000:
		return nil, fmt.Errorf("limit %d over 100000", q.Limit)
	}
	query := `SELECT seq, time, kind, key_id, sandbox_id, code_sha256, status, exit_code, duration_ms, cpu_ms,
		peak_memory_bytes, detail, host, port, bytes_in, bytes_out, count FROM audit`
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY seq DESC LIMIT ?"
	args = append(args, q.Limit)
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// Records of answered requests may still be in a server's open
	// transaction (writer.go): its commit comes first. Where the lock
	// cannot be had, what is committed is read.
	s.waiting.Lock()
	waitForWriters(ctx, conn)
	s.waiting.Unlock()
	rows, err := conn.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		var r Record
		var t int64
		if err := rows.Scan(&r.Seq, &t, &r.Kind, &r.KeyID, &r.SandboxID, &r.CodeSHA256, &r.Status, &r.ExitCode,
			&r.DurationMS, &r.CPUMS, &r.PeakMemoryBytes, &r.Detail, &r.Host, &r.Port, &r.BytesIn, &r.BytesOut, &r.Count); err != nil {
			return nil, err
		}
		r.Time = time.UnixMicro(t).UTC()
		out = append(out, r)
	}
	return out, rows.Err()
}
