package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// writer is the connection an AuditLog writes requests' records with. Its
// transaction begins (BEGIN IMMEDIATE: SQLite's write lock, held until
// the commit) when the first record of a batch is taken, before that
// record's request is answered; the records are inserted and committed
// after, off the request's path. A reader that first takes the write
// lock itself (Store.Audit) therefore waits for that commit, and sees
// every record whose request has been answered.
type writer struct {
	st     *Store
	conn   *sql.Conn // opened at the first begin
	insert *sql.Stmt // insertAudit, prepared on conn
}

// begin opens the writer's transaction.
func (w *writer) begin(ctx context.Context) error {
	if w.conn == nil {
		conn, err := w.st.db.Conn(ctx)
		if err != nil {
			return err
		}
		insert, err := conn.PrepareContext(ctx, insertAuditSQL)
		if err != nil {
			conn.Close()
			return err
		}
		w.conn, w.insert = conn, insert
	}
	_, err := w.conn.ExecContext(ctx, "BEGIN IMMEDIATE")
	if err != nil {
		// A transaction that a failed commit left open is ended first;
		// where there is none, the error is BEGIN's own (a busy lock).
		if _, rerr := w.conn.ExecContext(ctx, "ROLLBACK"); rerr == nil {
			_, err = w.conn.ExecContext(ctx, "BEGIN IMMEDIATE")
		}
	}
	return err
}

// commit inserts recs in the open transaction and commits it. seqs[i]
// is recs[i]'s seq, or 0 where it was not stored; lost counts those.
// A record whose insert fails is left out and the others are written:
// the failed statement undoes only itself, or, where SQLite rolled the
// whole transaction back (a full disk, an I/O error), the records before
// it are lost too and the rest go into a new transaction.
func (w *writer) commit(ctx context.Context, recs []Record) (seqs []int64, lost int, err error) {
	seqs = make([]int64, len(recs))
	var errs []error
	from := 0 // the first record of the transaction open now
	for i, r := range recs {
		var ierr error
		if seqs[i], ierr = insertRecord(ctx, w.insert, r); ierr == nil {
			continue
		}
		seqs[i] = 0
		errs = append(errs, ierr)
		// BEGIN fails inside a transaction: it tells whether SQLite
		// kept this one.
		if _, berr := w.conn.ExecContext(ctx, "BEGIN IMMEDIATE"); berr == nil {
			clear(seqs[from:i])
			from = i + 1
		}
	}
	if _, err := w.conn.ExecContext(ctx, "COMMIT"); err != nil {
		w.conn.ExecContext(ctx, "ROLLBACK")
		clear(seqs[from:])
		errs = append(errs, err)
	}
	for _, seq := range seqs {
		if seq == 0 {
			lost++
		}
	}
	return seqs, lost, errors.Join(errs...)
}

// close ends the writer's connection; a transaction left open is rolled
// back.
func (w *writer) close() {
	if w.conn != nil {
		w.insert.Close()
		w.conn.Close()
		w.conn = nil
	}
}

// waitForWriters takes SQLite's write lock on conn and gives it back: a
// writer's transaction open meanwhile (an AuditLog's, with records whose
// requests were answered) has then committed. It fails only where the
// lock cannot be had (a read-only database, a writer that holds it past
// the busy timeout).
func waitForWriters(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("wait for the audit log's writer: %w", err)
	}
	_, err := conn.ExecContext(ctx, "ROLLBACK")
	return err
}
