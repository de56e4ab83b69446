package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// Record is one entry of the audit log: an execution, a command or a
// one-shot run, and what it cost; or a sandbox's network connection
// (Kind "net", Status "allowed", "refused" or "failed", Detail the
// reason), with its destination and bytes.
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
}

// CodeHash is how the audit log identifies code without keeping it.
func CodeHash(code string) string {
	h := sha256.Sum256([]byte(code))
	return hex.EncodeToString(h[:])
}

// Append adds records in one transaction.
func (s *Store) Append(ctx context.Context, recs ...Record) error {
	if len(recs) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	stmt := tx.StmtContext(ctx, s.insertAudit)
	defer stmt.Close()
	for _, r := range recs {
		if r.Time.IsZero() {
			r.Time = time.Now()
		}
		if _, err := stmt.ExecContext(ctx, r.Time.UnixMicro(), r.Kind, r.KeyID, r.SandboxID, r.CodeSHA256, r.Status,
			r.ExitCode, r.DurationMS, r.CPUMS, r.PeakMemoryBytes, r.Detail, r.Host, r.Port, r.BytesIn, r.BytesOut); err != nil {
			return err
		}
	}
	return tx.Commit()
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

// Audit returns the records that match q, newest first.
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
		peak_memory_bytes, detail, host, port, bytes_in, bytes_out FROM audit`
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY seq DESC LIMIT ?"
	args = append(args, q.Limit)
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		var r Record
		var t int64
		if err := rows.Scan(&r.Seq, &t, &r.Kind, &r.KeyID, &r.SandboxID, &r.CodeSHA256, &r.Status, &r.ExitCode,
			&r.DurationMS, &r.CPUMS, &r.PeakMemoryBytes, &r.Detail, &r.Host, &r.Port, &r.BytesIn, &r.BytesOut); err != nil {
			return nil, err
		}
		r.Time = time.UnixMicro(t).UTC()
		out = append(out, r)
	}
	return out, rows.Err()
}
