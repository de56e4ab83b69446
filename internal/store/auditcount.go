package store

import (
	"context"
	"errors"
	"strconv"
	"time"
)

// counted says whether a connection's record is counted into one row per
// sandbox, destination and outcome per window (AuditOptions.CountWindow)
// rather than written as a row of its own: the connections that can be
// repeated at no cost, whose rows would otherwise grow the log as fast as
// someone cares to make them.
//   - An egress connection the sandbox's proxy refused or could not make
//     (a loop of them, at the proxy's connection rate, was one row each
//     for as long as the sandbox lived).
//   - Every connection to a sandbox's port from outside: anyone with a
//     preview link opens them at any rate, nothing paces them, and a
//     refused one (nothing listens) costs the sender nothing.
//
// An allowed egress connection keeps a row of its own, with its
// destination, address and bytes: the proxy paces every sandbox's
// connections (50 a second by default), which bounds them, and they are
// what an audit of a sandbox's network is for.
func counted(r Record) bool {
	switch r.Kind {
	case "net":
		return r.Status != "allowed"
	case "port":
		return true
	}
	return false
}

// Counted says whether an AuditLog counts r into a row per window rather
// than writing it as a row of its own.
func Counted(r Record) bool { return counted(r) }

// OnCounted has f called with each counted row once its window has
// ended: the row as a whole, its count, bytes and duration the totals of
// the connections it stands for (written or not). A cluster's node logs
// them, as it logs the records that are rows of their own. Set it before
// the first record.
func (a *AuditLog) OnCounted(f func(Record)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.counts.onEnd = f
}

// maxRowsPerSandbox bounds a sandbox's counted rows in one window: past
// it, its other destinations are counted together, in one row whose host
// is "*" (a loop over addresses or ports is then one row, not one a
// destination).
const maxRowsPerSandbox = 64

// OtherDestinations is the host of the row that counts a sandbox's
// connections to destinations past maxRowsPerSandbox in one window.
const OtherDestinations = "*"

type tallyKey struct {
	kind, keyID, sandbox, status, host string
	port                               int
}

// tally is one counted row while its window lasts.
type tally struct {
	key  tallyKey
	ends time.Time // its window's end
	// seq is its row's: 0 while the row is being written, -1 when that
	// failed (what it counts next goes into a new row).
	seq   int64
	first Record // the record that opened it
	add   rowAdd // counted since its row was last written
	total rowAdd // counted since it opened, the first included
}

// counts are the counted rows of the current windows; guarded by
// AuditLog.mu. They are bounded by the sandboxes: maxRowsPerSandbox+1
// each.
type counts struct {
	open       map[tallyKey]*tally
	perSandbox map[string]int
	ended      []*tally // past their window, with counts still to write
	onEnd      func(Record)
	finished   []Record // rows whose window ended, for onEnd
}

func (c *counts) init() {
	c.open = map[tallyKey]*tally{}
	c.perSandbox = map[string]int{}
}

// count counts r into its row, if its window has one: done. If not, it
// opens the row, which the caller writes: r as it is to be written (to
// the row of other destinations, when the sandbox has too many).
// Called with a.mu held.
func (a *AuditLog) count(r Record) (Record, *tally, bool) {
	c := &a.counts
	now := a.opt.Now()
	k := tallyKey{kind: r.Kind, keyID: r.KeyID, sandbox: r.SandboxID, status: r.Status, host: r.Host, port: r.Port}
	t := c.open[k]
	if t != nil && !now.Before(t.ends) {
		a.endTally(t)
		t = nil
	}
	if t == nil && c.perSandbox[r.SandboxID] >= maxRowsPerSandbox {
		k.host, k.port = OtherDestinations, 0
		r.Host, r.Port = OtherDestinations, 0
		r.Detail = "destinations past the first " + strconv.Itoa(maxRowsPerSandbox) + " of this window, counted together"
		if t = c.open[k]; t != nil && !now.Before(t.ends) {
			a.endTally(t)
			t = nil
		}
	}
	if t != nil {
		t.add.add(r)
		t.total.add(r)
		a.stats.Counted++
		return r, t, true
	}
	t = &tally{key: k, ends: now.Add(a.opt.CountWindow), first: r}
	t.total.add(r)
	c.open[k] = t
	c.perSandbox[r.SandboxID]++
	return r, t, false
}

// endTally closes a row's window; what it has counted and not written is
// written by the next flush.
func (a *AuditLog) endTally(t *tally) {
	c := &a.counts
	delete(c.open, t.key)
	if c.perSandbox[t.key.sandbox]--; c.perSandbox[t.key.sandbox] <= 0 {
		delete(c.perSandbox, t.key.sandbox)
	}
	if t.add.count > 0 || t.seq == 0 {
		c.ended = append(c.ended, t)
	}
	if c.onEnd != nil {
		r := t.first
		r.Count, r.BytesIn, r.BytesOut, r.DurationMS = t.total.count, t.total.bytesIn, t.total.bytesOut, t.total.durationMS
		c.finished = append(c.finished, r)
	}
}

// add counts r.
func (a *rowAdd) add(r Record) {
	a.count++
	a.bytesIn += r.BytesIn
	a.bytesOut += r.BytesOut
	a.durationMS += r.DurationMS
}

// flushCounts writes what counted rows have gathered since their rows
// were written, and forgets the rows whose windows have ended (all: every
// row, when the log closes). A row whose first write failed is written
// anew with what it counted since.
func (a *AuditLog) flushCounts(all bool) {
	a.mu.Lock()
	c := &a.counts
	now := a.opt.Now()
	for _, t := range c.open {
		if all || !now.Before(t.ends) {
			a.endTally(t)
		}
	}
	var adds []rowAdd
	var fresh []Record
	var freshT []*tally
	var keep []*tally
	take := func(t *tally) {
		switch {
		case t.add.count == 0:
		case t.seq == 0:
			return // its row is being written: the next flush
		case t.seq < 0:
			r := t.first
			r.Count, r.BytesIn, r.BytesOut, r.DurationMS = t.add.count, t.add.bytesIn, t.add.bytesOut, t.add.durationMS
			fresh = append(fresh, r)
			freshT = append(freshT, t)
		default:
			add := t.add
			add.seq = t.seq
			adds = append(adds, add)
		}
		t.add = rowAdd{}
	}
	for _, t := range c.ended {
		take(t)
		if t.seq == 0 {
			keep = append(keep, t)
		}
	}
	c.ended = keep
	for _, t := range c.open {
		take(t)
	}
	finished, onEnd := c.finished, c.onEnd
	c.finished = nil
	a.mu.Unlock()
	for _, r := range finished {
		onEnd(r)
	}
	if len(adds) == 0 && len(fresh) == 0 {
		return
	}
	ctx := context.Background()
	var addErr, freshErr error
	var seqs []int64
	if len(adds) > 0 {
		a.asWriter(func() { addErr = a.st.addToRows(ctx, adds) })
	}
	if len(fresh) > 0 {
		a.asWriter(func() { seqs, freshErr = a.st.appendRows(ctx, fresh) })
	}
	var lost int64
	if addErr != nil {
		for _, add := range adds {
			lost += add.count
		}
	}
	if freshErr != nil {
		for _, r := range fresh {
			lost += r.Count
		}
	}
	if err := errors.Join(addErr, freshErr); err != nil {
		a.failed("counts", int(lost), err)
	} else {
		a.succeeded()
	}
	if freshErr == nil {
		a.mu.Lock()
		for i, t := range freshT {
			t.seq = seqs[i]
		}
		a.mu.Unlock()
	}
}
