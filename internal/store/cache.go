package store

import (
	"context"
	"log/slog"
	"runtime"
	"sync"
	"time"
)

// Keyring answers "whose key is this?" for every request without a
// database query each time: lookups are cached for TTL, so a revoked key
// stops working within TTL.
type Keyring struct {
	st  *Store
	ttl time.Duration

	mu      sync.Mutex
	byToken map[string]cached // by token hash
	byID    map[string]Key
}

type cached struct {
	key     Key
	ok      bool
	expires time.Time
}

// NewKeyring caches st's keys for ttl.
func NewKeyring(st *Store, ttl time.Duration) *Keyring {
	return &Keyring{st: st, ttl: ttl, byToken: map[string]cached{}, byID: map[string]Key{}}
}

// Owner returns the id of the key a token belongs to.
func (k *Keyring) Owner(token string) (string, error) {
	h := hashToken(token)
	now := time.Now()
	k.mu.Lock()
	c, hit := k.byToken[h]
	k.mu.Unlock()
	if !hit || now.After(c.expires) {
		key, err := k.st.Lookup(context.Background(), token)
		switch {
		case err == nil:
			c = cached{key: key, ok: true}
		case err == ErrInvalidKey:
			c = cached{}
		default:
			return "", err
		}
		c.expires = now.Add(k.ttl)
		k.mu.Lock()
		if len(k.byToken) > 100_000 {
			// Bounded: random tokens must not grow the cache forever.
			clear(k.byToken)
		}
		k.byToken[h] = c
		if c.ok {
			k.byID[c.key.ID] = c.key
		}
		k.mu.Unlock()
	}
	if !c.ok {
		return "", ErrInvalidKey
	}
	return c.key.ID, nil
}

// Quota returns a key's own quotas (zero: the server's defaults).
func (k *Keyring) Quota(id string) (maxSandboxes, maxExecutions int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	key := k.byID[id]
	return key.MaxSandboxes, key.MaxExecutions
}

// AuditLog writes the audit log with group commit: Record returns once its
// record is committed, so that a request's answer, sent after, always has
// its record in the database (and a crash of the server loses no record of
// an answered request). The caller whose record finds no commit under way
// writes it at once, on its own goroutine; records that arrive while a
// commit is under way wait for the next one, which the first of their
// callers makes, taking them all in one transaction. Under load a commit
// serves many requests, and nobody waits for a timer.
type AuditLog struct {
	st  *Store
	log *slog.Logger

	mu        sync.Mutex
	wrote     *sync.Cond // a commit ended
	queue     []Record   // records of the next commit
	next      uint64     // the number of the next commit, which queue is for
	committed uint64     // how many commits have ended
	writing   bool       // a commit is under way
	closed    bool

	stop    chan struct{} // ends the checkpointer
	stopped chan struct{}
	once    sync.Once
}

// checkpointEvery is how often the log's commits are checkpointed into
// the database file, off every request's path.
const checkpointEvery = time.Second

// maxBatch bounds one transaction; a caller whose record would be past it
// waits for a later one.
const maxBatch = 1024

// NewAuditLog returns an audit log writing to st.
func NewAuditLog(st *Store, log *slog.Logger) *AuditLog {
	a := &AuditLog{st: st, log: log, next: 1, stop: make(chan struct{}), stopped: make(chan struct{})}
	a.wrote = sync.NewCond(&a.mu)
	go a.checkpoints()
	return a
}

// checkpoints checkpoints the database while commits come.
func (a *AuditLog) checkpoints() {
	defer close(a.stopped)
	t := time.NewTicker(checkpointEvery)
	defer t.Stop()
	var done uint64
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
		}
		a.mu.Lock()
		n := a.committed
		a.mu.Unlock()
		if n == done {
			continue
		}
		if err := a.st.Checkpoint(context.Background()); err != nil {
			a.log.Warn("audit log checkpoint failed", "err", err)
			continue
		}
		done = n
	}
}

// Record writes r and returns once it is committed, or the commit has
// failed (which is logged: "audit log write failed"). After Close it
// writes nothing.
func (a *AuditLog) Record(r Record) {
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for len(a.queue) >= maxBatch {
		a.wrote.Wait()
	}
	if a.closed {
		a.log.Error("audit record after the log was closed", "kind", r.Kind, "sandbox", r.SandboxID)
		return
	}
	a.queue = append(a.queue, r)
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
		err := a.st.Append(context.Background(), batch...)
		if err != nil {
			a.log.Error("audit log write failed", "records", len(batch), "err", err)
		}
		a.mu.Lock()
		a.writing = false
		a.committed++
		a.wrote.Broadcast()
	}
}

// Close waits for the commit under way; records that come after are not
// written (and logged as such).
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
		if err := a.st.Checkpoint(context.Background()); err != nil {
			a.log.Warn("audit log checkpoint failed", "err", err)
		}
	})
}
