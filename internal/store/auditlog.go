package store

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"sync"
	"syscall"
	"time"

	sqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// AuditOptions bound what the audit log keeps. A server keeps its audit
// log within both bounds; the zero value keeps everything (tests, tools).
type AuditOptions struct {
	// Retention: rows older than this are deleted; zero: none by age.
	Retention time.Duration
	// MaxRows: at most this many rows are kept, the newest; zero: no
	// bound.
	MaxRows int64
	// CountWindow is how long one counted row gathers the connections
	// it stands for (see counted); zero: DefaultCountWindow.
	CountWindow time.Duration
	// Now is the clock of records and of retention; nil: time.Now.
	// Tests replace it.
	Now func() time.Time
}

// Defaults of a server's audit log (vivarium serve --audit-retention,
// --audit-max-rows): 30 days, and two million rows, about 500 MiB of
// database at the 262 bytes a row (with its indexes) that a connection's
// row measured.
const (
	DefaultAuditRetention = 30 * 24 * time.Hour
	DefaultAuditMaxRows   = 2_000_000
	DefaultCountWindow    = time.Minute
)

// AuditStats are what the audit log has done, and failed to do, since
// the server started: the server's metrics.
type AuditStats struct {
	// Failing: the last write failed (a full disk, say), and records
	// are being lost.
	Failing bool
	// WriteFailures counts the writes that failed; Lost the records
	// (connections, for counted rows) they did not store.
	WriteFailures, Lost int64
	// Pruned counts the rows retention deleted.
	Pruned int64
	// Counted counts the connections counted into a row written
	// before, rather than written as rows of their own.
	Counted int64
}

// AuditLog writes the audit log with group commit: Record returns once its
// record is committed, so that a request's answer, sent after, always has
// its record in the database (and a crash of the server loses no record of
// an answered request). The caller whose record finds no commit under way
// writes it at once, on its own goroutine; records that arrive while a
// commit is under way wait for the next one, which the first of their
// callers makes, taking them all in one transaction. Under load a commit
// serves many requests, and nobody waits for a timer.
//
// In the background, off every request's path, the log checkpoints,
// writes what its counted rows have gathered (auditcount.go) and deletes
// what its AuditOptions no longer keep, each in short transactions taken
// as the log's writer: a record that arrives meanwhile waits for one
// such transaction at most, as it would behind another commit, and a
// request's commit waiting goes before the next batch.
//
// A write that fails (SQLITE_FULL, ENOSPC) does not stop the server:
// Record returns, the failure is logged (once, then at most once a
// minute while it lasts) and counted (Stats), and the next records are
// tried again.
type AuditLog struct {
	st  *Store
	log *slog.Logger
	opt AuditOptions

	mu        sync.Mutex
	wrote     *sync.Cond // a commit or a background write ended
	queue     []queued   // records of the next commit
	next      uint64     // the number of the next commit, which queue is for
	committed uint64     // how many commits have ended
	writing   bool       // a commit or a background write is under way
	writes    uint64     // writes of every kind, for the checkpointer
	closed    bool
	counts    counts // counted rows (auditcount.go)
	stats     AuditStats
	failLog   time.Time // when a failure was last logged
	okLog     time.Time // when a recovery was last logged
	lostSince int64     // records lost since a line last said so

	stop    chan struct{} // ends the background work
	stopped chan struct{}
	once    sync.Once
}

type queued struct {
	rec   Record
	tally *tally // the counted row this record opens; nil for most
}

// Intervals of the background work.
const (
	// checkpointEvery is how often the log's writes are checkpointed
	// into the database file, and counted rows written.
	checkpointEvery = time.Second
	// pruneEvery is how often retention runs; pruneBatch how many rows
	// one of its transactions deletes: 3 to 9 ms of writing on the
	// two-core test machine, which a record arriving then waits for.
	pruneEvery = 10 * time.Second
	pruneBatch = 200
	// vacuumStep is how many free pages one transaction gives back.
	vacuumStep = 256
	// failureLogEvery bounds the log lines of a failure that lasts.
	failureLogEvery = time.Minute
)

// maxBatch bounds one transaction; a caller whose record would be past it
// waits for a later one.
const maxBatch = 1024

// NewAuditLog returns an audit log writing to st, kept within opt.
func NewAuditLog(st *Store, log *slog.Logger, opt AuditOptions) *AuditLog {
	if opt.CountWindow <= 0 {
		opt.CountWindow = DefaultCountWindow
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	a := &AuditLog{st: st, log: log, opt: opt, next: 1, stop: make(chan struct{}), stopped: make(chan struct{})}
	a.wrote = sync.NewCond(&a.mu)
	a.counts.init()
	go a.background()
	return a
}

// background checkpoints the database while writes come, writes counted
// rows, and prunes.
func (a *AuditLog) background() {
	defer close(a.stopped)
	t := time.NewTicker(checkpointEvery)
	defer t.Stop()
	var done uint64
	lastPrune := time.Now()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
		}
		a.flushCounts(false)
		if time.Since(lastPrune) >= pruneEvery {
			a.prune()
			lastPrune = time.Now()
		}
		a.mu.Lock()
		n := a.writes
		a.mu.Unlock()
		if n == done {
			continue
		}
		if err := a.st.Checkpoint(context.Background()); err != nil {
			a.failed("checkpoint", 0, err)
			continue
		}
		done = n
	}
}

// Record writes r and returns once it is committed, or the commit has
// failed (which is logged and counted). A connection that the log counts
// (see counted) returns at once when a row of its window is there to
// count it. After Close it writes nothing.
func (a *AuditLog) Record(r Record) {
	if r.Time.IsZero() {
		r.Time = a.opt.Now()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		a.log.Error("audit record after the log was closed", "kind", r.Kind, "sandbox", r.SandboxID)
		return
	}
	var t *tally
	if counted(r) {
		var done bool
		if r, t, done = a.count(r); done {
			return
		}
	}
	for len(a.queue) >= maxBatch {
		a.wrote.Wait()
	}
	a.queue = append(a.queue, queued{rec: r, tally: t})
	mine := a.next
	for a.committed < mine {
		if a.writing {
			a.wrote.Wait()
			continue
		}
		// No commit under way: this caller makes the next one, with
		// every record queued for it, after letting the requests that
		// are about to record have their turn.
		a.writing = true
		a.mu.Unlock()
		runtime.Gosched()
		a.mu.Lock()
		batch := a.queue
		a.queue = nil
		a.next++
		a.mu.Unlock()
		recs := make([]Record, len(batch))
		for i, q := range batch {
			recs[i] = q.rec
		}
		seqs, err := a.st.appendRows(context.Background(), recs)
		if err != nil {
			a.failed("write", len(batch), err)
		} else {
			a.succeeded()
		}
		a.mu.Lock()
		for i, q := range batch {
			if q.tally != nil {
				q.tally.seq = -1 // its row is lost: counts go to a new one
				if err == nil {
					q.tally.seq = seqs[i]
				}
			}
		}
		a.writing = false
		a.committed++
		a.writes++
		a.wrote.Broadcast()
	}
}

// asWriter runs fn as the log's writer, between commits: a commit that
// records wait for goes first, and records that arrive while fn runs
// wait for the next commit, as they would behind another's. fn holds the
// database for one short transaction.
func (a *AuditLog) asWriter(fn func()) {
	a.mu.Lock()
	if len(a.queue) > 0 {
		for turn := a.next; a.committed < turn; {
			a.wrote.Wait()
		}
	}
	for a.writing {
		a.wrote.Wait()
	}
	a.writing = true
	a.mu.Unlock()
	fn()
	a.mu.Lock()
	a.writing = false
	a.writes++
	a.wrote.Broadcast()
	a.mu.Unlock()
}

// prune deletes the rows that retention no longer keeps, a batch at a
// time, then gives the pages they held back to the file system when
// they are many.
func (a *AuditLog) prune() {
	p := Prune{Keep: a.opt.MaxRows, Batch: pruneBatch}
	if a.opt.Retention > 0 {
		p.Before = a.opt.Now().Add(-a.opt.Retention)
	}
	if p.Keep <= 0 && p.Before.IsZero() {
		return
	}
	var total int64
	for {
		var n int64
		var err error
		a.asWriter(func() { n, err = a.st.PruneAudit(context.Background(), p) })
		total += n
		if err != nil {
			a.failed("prune", 0, err)
			break
		}
		if n < int64(p.Batch) || a.stopping() {
			break
		}
	}
	a.mu.Lock()
	a.stats.Pruned += total
	a.mu.Unlock()
	if total > 0 {
		a.vacuum()
	}
}

// vacuum gives free pages of the database file back to the file system
// while they are more than a quarter of it (and over 4 MiB). Pruning at
// a steady pace frees about what new rows then take, and those pages are
// reused in place; the pages of a flood that has aged out, or of a bound
// lowered, are given back. A database made before auto_vacuum was set
// keeps its free pages for reuse: its file does not grow while its rows
// are bounded, but does not shrink either.
func (a *AuditLog) vacuum() {
	ctx := context.Background()
	for !a.stopping() {
		free, total, incremental, err := a.st.freePages(ctx)
		if err != nil || !incremental || free <= max(1024, total/4) {
			return
		}
		a.asWriter(func() { err = a.st.vacuum(ctx, vacuumStep) })
		if err != nil {
			a.failed("vacuum", 0, err)
			return
		}
	}
}

func (a *AuditLog) stopping() bool {
	select {
	case <-a.stop:
		return true
	default:
		return false
	}
}

// failed counts and logs a failed write of records (0: a checkpoint,
// prune or vacuum, which lose none): at most one line a minute, with the
// records lost since the last.
func (a *AuditLog) failed(what string, records int, err error) {
	a.mu.Lock()
	a.stats.WriteFailures++
	a.stats.Lost += int64(records)
	a.lostSince += int64(records)
	if records > 0 {
		a.stats.Failing = true
	}
	now := time.Now()
	if !a.failLog.IsZero() && now.Sub(a.failLog) < failureLogEvery {
		a.mu.Unlock()
		return
	}
	a.failLog = now
	lost := a.lostSince
	a.lostSince = 0
	a.mu.Unlock()
	attrs := []any{"what", what, "records_lost", lost, "err", err}
	if diskFull(err) {
		attrs = append(attrs, "disk_full", true)
	}
	a.log.Error("audit log write failed (logged at most once a minute)", attrs...)
}

// succeeded ends a run of failed record writes, if any, with a log line
// (at most one a minute).
func (a *AuditLog) succeeded() {
	a.mu.Lock()
	if !a.stats.Failing {
		a.mu.Unlock()
		return
	}
	a.stats.Failing = false
	now := time.Now()
	if now.Sub(a.okLog) < failureLogEvery {
		a.mu.Unlock()
		return
	}
	a.okLog = now
	lost := a.lostSince
	a.lostSince = 0
	a.mu.Unlock()
	a.log.Warn("audit log writes succeed again", "records_lost", lost)
}

// diskFull says whether err is SQLite's or the system's "no space".
func diskFull(err error) bool {
	var se *sqlite.Error
	if errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_FULL {
		return true
	}
	return errors.Is(err, syscall.ENOSPC)
}

// Stats returns what the log has done and failed to do.
func (a *AuditLog) Stats() AuditStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

// Close waits for the commit under way, writes what counted rows have
// gathered and checkpoints; records that come after are not written
// (and logged as such).
func (a *AuditLog) Close() {
	a.mu.Lock()
	a.closed = true
	for a.writing || len(a.queue) > 0 {
		a.wrote.Wait()
	}
	a.mu.Unlock()
	a.once.Do(func() {
		close(a.stop)
		<-a.stopped
		a.flushCounts(true)
		if err := a.st.Checkpoint(context.Background()); err != nil {
			a.log.Warn("audit log checkpoint failed", "err", err)
		}
	})
}
