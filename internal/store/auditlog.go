package store

import (
	"context"
	"errors"
	"log/slog"
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
	// Linger is how long a batch's transaction stays open for more
	// records after its first (see AuditLog); zero: DefaultLinger.
	Linger time.Duration
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
	// DefaultLinger: a server answering one client's executions back to
	// back (0.3 to 1 ms each) commits several of their records at once,
	// and the CLI's read waits a few milliseconds at most.
	DefaultLinger = 2 * time.Millisecond
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
	// Commits counts the batches of records committed: the
	// transactions the records took.
	Commits int64
}

// AuditLog writes the audit log in batches, on a goroutine of its own,
// one transaction a batch. Record returns once its record is taken into
// the open transaction, whose write lock the log holds from before the
// first record of the batch is taken until it is committed (writer.go):
// a reader that takes the lock first (Store.Audit: `vivarium audit`,
// tests) waits for that commit, so it sees every record whose request
// was answered, and the request does not wait for the commit itself.
//
// A batch stays open for the records that come within its linger
// (AuditOptions.Linger) after its first, and is committed then, or at
// once when it holds maxBatch records or something waits for it (Flush,
// Close, a background write): a transaction's cost (its BEGIN, and the
// pages its commit writes to the log) is paid once for the records of
// many requests, those of one client's requests sent back to back too.
// Records that arrive while a batch is being written wait for the next
// transaction to begin; at most maxBatch wait in the queue, and a record
// past them waits for room (none is dropped). Close writes what is
// queued. A crash of the server (kill -9) loses the open batch: records
// of requests answered within its linger before.
//
// In the background, off every request's path, the log checkpoints,
// writes what its counted rows have gathered (auditcount.go) and deletes
// what its AuditOptions no longer keep, each in short transactions taken
// as the log's writer: a record that arrives meanwhile waits for one
// such transaction at most, as it would behind a batch, and a background
// write that waits goes between two batches (a steady stream of records
// does not hold it off).
//
// A write that fails (SQLITE_FULL, ENOSPC) does not stop the server:
// Record returns, the failure is logged (once, then at most once a
// minute while it lasts) and counted (Stats), and the next records are
// tried again.
type AuditLog struct {
	st  *Store
	log *slog.Logger
	opt AuditOptions
	w   writer // used by the batch writer, and by Record to begin

	mu        sync.Mutex
	changed   *sync.Cond // the state changed, or a batch began or ended
	state     logState
	queue     []queued // records of the next batch to write
	batch     uint64   // batches numbered so far: queue is for batch+1
	begun     uint64   // batches whose transaction has begun (or failed to)
	done      uint64   // batches written (or failed)
	last      uint64   // the batch of the last record taken
	bgWait    int      // background writes waiting for their turn
	callers   int      // Records under way, which Close waits for
	flushing  int      // Flush calls waiting: the open batch is committed now
	writes    uint64   // writes of every kind, for the checkpointer
	closed    bool
	counts    counts // counted rows (auditcount.go)
	stats     AuditStats
	failLog   time.Time // when a failure was last logged
	okLog     time.Time // when a recovery was last logged
	lostSince int64     // records lost since a line last said so

	stop    chan struct{} // ends the background work and the batch writer
	stopped chan struct{}
	written chan struct{} // the batch writer has ended
	once    sync.Once
}

// logState is what holds the database: nothing; the transaction of the
// next batch, beginning or open (taking records); the batch being
// written; or a background write.
type logState int

const (
	logIdle logState = iota
	logBeginning
	logOpen
	logCommitting
	logBackground
)

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
	if opt.Linger <= 0 {
		opt.Linger = DefaultLinger
	}
	a := &AuditLog{st: st, log: log, opt: opt, w: writer{st: st},
		stop: make(chan struct{}), stopped: make(chan struct{}), written: make(chan struct{})}
	a.changed = sync.NewCond(&a.mu)
	a.counts.init()
	go a.background()
	go a.writeBatches()
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

// Record takes r into the next batch and returns once that batch's
// transaction has begun: a reader of the log sees r from then on (see
// AuditLog). On a quiet server its caller begins it; a record that
// arrives while a batch is written waits for the writer to begin the
// next. A failure to begin is logged and counted, and the batch's
// records are lost. A connection that the log counts (see counted)
// returns at once when a row of its window is there to count it. After
// Close it writes nothing.
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
	a.callers++
	defer func() {
		if a.callers--; a.closed {
			a.changed.Broadcast() // Close waits for the last caller
		}
	}()
	var t *tally
	if counted(r) {
		var done bool
		if r, t, done = a.count(r); done {
			return
		}
	}
	for len(a.queue) >= maxBatch {
		a.changed.Wait()
	}
	a.queue = append(a.queue, queued{rec: r, tally: t})
	if len(a.queue) == maxBatch {
		a.changed.Broadcast() // a full batch lingers no more
	}
	mine := a.batch + 1
	a.last = mine
	if a.state == logIdle && a.bgWait == 0 {
		a.begin() // no batch under way: this caller begins one
		return
	}
	for a.begun < mine {
		a.changed.Wait()
	}
}

// begin begins the next batch's transaction, taking SQLite's write lock;
// called with a.mu held, in state logIdle, with records queued. If it
// fails, they are lost, and counted as such.
func (a *AuditLog) begin() {
	a.state = logBeginning
	a.mu.Unlock()
	err := a.w.begin(context.Background())
	a.mu.Lock()
	a.begun++
	a.state = logOpen
	if err != nil {
		lost := a.queue
		a.queue = nil
		for _, q := range lost {
			if q.tally != nil {
				q.tally.seq = -1 // its row is lost: counts go to a new one
			}
		}
		a.batch++
		a.done++
		a.state = logIdle
		a.mu.Unlock()
		a.failed("write", len(lost), err)
		a.mu.Lock()
	}
	a.changed.Broadcast()
}

// writeBatches writes the open transaction's records and commits them,
// batch after batch, and begins the transaction of records that came
// meanwhile, until the log closes.
func (a *AuditLog) writeBatches() {
	defer close(a.written)
	a.mu.Lock()
	defer a.mu.Unlock()
	for {
		switch {
		case a.state == logIdle && len(a.queue) > 0 && a.bgWait == 0:
			a.begin()
			continue
		case a.state == logOpen:
		case a.state == logIdle && len(a.queue) == 0 && a.stopping():
			return
		default:
			a.changed.Wait()
			continue
		}
		a.linger()
		a.state = logCommitting
		a.batch++
		batch := a.queue
		a.queue = nil
		a.changed.Broadcast() // room in the queue
		a.mu.Unlock()
		recs := make([]Record, len(batch))
		for i, q := range batch {
			recs[i] = q.rec
		}
		seqs, lost, err := a.w.commit(context.Background(), recs)
		if err != nil {
			a.failed("write", lost, err)
		} else {
			a.succeeded()
		}
		a.mu.Lock()
		if lost < len(recs) {
			a.stats.Commits++
		}
		for i, q := range batch {
			if q.tally != nil {
				q.tally.seq = -1 // its row is lost: counts go to a new one
				if seqs != nil && seqs[i] > 0 {
					q.tally.seq = seqs[i]
				}
			}
		}
		a.state = logIdle
		a.done++
		a.writes++
		a.changed.Broadcast()
	}
}

// linger keeps the open batch open, with a.mu held, for the records that
// come within a.opt.Linger of its beginning: until then, unless the batch
// is full or something waits for it.
func (a *AuditLog) linger() {
	deadline := time.Now().Add(a.opt.Linger)
	wake := time.AfterFunc(a.opt.Linger, func() {
		a.mu.Lock()
		a.changed.Broadcast()
		a.mu.Unlock()
	})
	defer wake.Stop()
	for len(a.queue) < maxBatch && a.flushing == 0 && a.bgWait == 0 && !a.closed && !a.stopping() &&
		time.Now().Before(deadline) {
		a.changed.Wait()
	}
}

// Flush returns once every record that Record has taken is written, or
// its write has failed (and Stats says so); the open batch is committed
// without waiting for its linger.
func (a *AuditLog) Flush() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.flushing++
	defer func() { a.flushing-- }()
	a.changed.Broadcast()
	for a.done < a.last {
		a.changed.Wait()
	}
}

// asWriter runs fn as the log's writer, between batches: after the batch
// under way, before the next one begins; records that arrive while fn
// runs wait for it, as they would behind a batch. fn holds the database
// for one short transaction.
func (a *AuditLog) asWriter(fn func()) {
	a.mu.Lock()
	a.bgWait++
	a.changed.Broadcast() // the open batch lingers no more
	for a.state != logIdle {
		a.changed.Wait()
	}
	a.bgWait--
	a.state = logBackground
	a.mu.Unlock()
	fn()
	a.mu.Lock()
	a.state = logIdle
	a.writes++
	a.changed.Broadcast()
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

// Close writes the records taken and waits for their commit, writes
// what counted rows have gathered and checkpoints; records that come
// after are not written (and logged as such).
func (a *AuditLog) Close() {
	a.mu.Lock()
	a.closed = true
	a.changed.Broadcast() // the open batch lingers no more
	for a.callers > 0 || a.done < a.last {
		a.changed.Wait()
	}
	a.mu.Unlock()
	a.once.Do(func() {
		close(a.stop)
		a.mu.Lock()
		a.changed.Broadcast()
		a.mu.Unlock()
		<-a.written
		<-a.stopped
		a.w.close()
		a.flushCounts(true)
		if err := a.st.Checkpoint(context.Background()); err != nil {
			a.log.Warn("audit log checkpoint failed", "err", err)
		}
	})
}
