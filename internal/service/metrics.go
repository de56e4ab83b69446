package service

import (
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/pool"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/store"
)

// Metrics are the service's counters, written in Prometheus's text format.
type Metrics struct {
	mu         sync.Mutex
	executions map[sandbox.Status]int64
	commands   map[sandbox.Status]int64
	execDur    histogram
	createDur  histogram
	expired    atomic.Int64
	pauses     atomic.Int64
	resumes    atomic.Int64
	audit      func() store.AuditStats // nil: no audit log to report
}

// SetAuditStats has the metrics report an audit log's
// (store.AuditLog.Stats): whether its writes fail (a full disk), what it
// lost, pruned and counted.
func (m *Metrics) SetAuditStats(stats func() store.AuditStats) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.audit = stats
}

func newMetrics() *Metrics {
	return &Metrics{
		executions: map[sandbox.Status]int64{},
		commands:   map[sandbox.Status]int64{},
		execDur:    newHistogram(0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120),
		createDur:  newHistogram(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
	}
}

func (m *Metrics) observeExec(st sandbox.Status, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.executions[st]++
	m.execDur.observe(d.Seconds())
}

func (m *Metrics) observeCommand(st sandbox.Status) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.commands[st]++
}

func (m *Metrics) observeCreate(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.createDur.observe(d.Seconds())
}

// Write writes every metric; live is the number of live sandboxes.
func (m *Metrics) Write(w io.Writer, live int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	fmt.Fprintf(w, "# HELP vivarium_sandboxes_live Sandboxes alive now.\n# TYPE vivarium_sandboxes_live gauge\nvivarium_sandboxes_live %d\n", live)
	fmt.Fprintf(w, "# HELP vivarium_sandboxes_expired_total Sandboxes closed by their timeout.\n# TYPE vivarium_sandboxes_expired_total counter\nvivarium_sandboxes_expired_total %d\n", m.expired.Load())
	fmt.Fprintf(w, "# HELP vivarium_sandboxes_paused_total Sandboxes paused.\n# TYPE vivarium_sandboxes_paused_total counter\nvivarium_sandboxes_paused_total %d\n", m.pauses.Load())
	fmt.Fprintf(w, "# HELP vivarium_sandboxes_resumed_total Sandboxes resumed.\n# TYPE vivarium_sandboxes_resumed_total counter\nvivarium_sandboxes_resumed_total %d\n", m.resumes.Load())
	counter := func(name, help string, by map[sandbox.Status]int64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s counter\n", name, help, name)
		keys := make([]string, 0, len(by))
		for k := range by {
			keys = append(keys, string(k))
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "%s{status=%q} %d\n", name, k, by[sandbox.Status(k)])
		}
	}
	counter("vivarium_executions_total", "Executions by outcome.", m.executions)
	counter("vivarium_commands_total", "Shell commands by outcome.", m.commands)
	m.execDur.write(w, "vivarium_execution_duration_seconds", "Duration of executions.")
	m.createDur.write(w, "vivarium_sandbox_create_duration_seconds", "Time to create a sandbox ready for code.")
	if m.audit != nil {
		writeAuditMetrics(w, m.audit())
	}
}

// writeAuditMetrics reports the audit log: a failing write (a full disk)
// is seen here as well as in the server's log.
func writeAuditMetrics(w io.Writer, st store.AuditStats) {
	failing := 0
	if st.Failing {
		failing = 1
	}
	fmt.Fprintf(w, "# HELP vivarium_audit_write_failing 1 while the audit log's writes fail (a full disk): records are being lost.\n# TYPE vivarium_audit_write_failing gauge\nvivarium_audit_write_failing %d\n", failing)
	fmt.Fprintf(w, "# HELP vivarium_audit_write_failures_total Writes of the audit log that failed.\n# TYPE vivarium_audit_write_failures_total counter\nvivarium_audit_write_failures_total %d\n", st.WriteFailures)
	fmt.Fprintf(w, "# HELP vivarium_audit_records_lost_total Audit records (connections, for counted rows) lost to failed writes.\n# TYPE vivarium_audit_records_lost_total counter\nvivarium_audit_records_lost_total %d\n", st.Lost)
	fmt.Fprintf(w, "# HELP vivarium_audit_rows_pruned_total Audit rows deleted by retention (--audit-retention, --audit-max-rows).\n# TYPE vivarium_audit_rows_pruned_total counter\nvivarium_audit_rows_pruned_total %d\n", st.Pruned)
	fmt.Fprintf(w, "# HELP vivarium_audit_connections_counted_total Connections counted into an audit row written before, not written as rows of their own.\n# TYPE vivarium_audit_connections_counted_total counter\nvivarium_audit_connections_counted_total %d\n", st.Counted)
}

type histogram struct {
	bounds []float64
	counts []int64
	sum    float64
	n      int64
}

func newHistogram(bounds ...float64) histogram {
	return histogram{bounds: bounds, counts: make([]int64, len(bounds))}
}

func (h *histogram) observe(v float64) {
	for i, b := range h.bounds {
		if v <= b {
			h.counts[i]++
		}
	}
	h.sum += v
	h.n++
}

func (h *histogram) write(w io.Writer, name, help string) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
	for i, b := range h.bounds {
		fmt.Fprintf(w, "%s_bucket{le=\"%g\"} %d\n", name, b, h.counts[i])
	}
	fmt.Fprintf(w, "%s_bucket{le=\"+Inf\"} %d\n%s_sum %g\n%s_count %d\n", name, h.n, name, h.sum, name, h.n)
}

// writePoolMetrics reports what the pool holds ready and what that costs.
func writePoolMetrics(w io.Writer, stats []pool.Stat, evicted int64) {
	var ready, creating, memory, hits, misses int64
	for _, st := range stats {
		ready += int64(st.Ready)
		creating += int64(st.Creating)
		memory += st.MemoryBytes
		hits += st.Hits
		misses += st.Misses
	}
	fmt.Fprintf(w, "# HELP vivarium_pool_ready Fresh sandboxes ready in the pool.\n# TYPE vivarium_pool_ready gauge\nvivarium_pool_ready %d\n", ready)
	fmt.Fprintf(w, "# HELP vivarium_pool_creating Sandboxes being made for the pool.\n# TYPE vivarium_pool_creating gauge\nvivarium_pool_creating %d\n", creating)
	fmt.Fprintf(w, "# HELP vivarium_pool_configurations Configurations the pool keeps ready.\n# TYPE vivarium_pool_configurations gauge\nvivarium_pool_configurations %d\n", len(stats))
	fmt.Fprintf(w, "# HELP vivarium_pool_memory_bytes Memory (PSS) of the ready sandboxes: the pool's cost at rest.\n# TYPE vivarium_pool_memory_bytes gauge\nvivarium_pool_memory_bytes %d\n", memory)
	fmt.Fprintf(w, "# HELP vivarium_pool_hits_total Sandboxes served from the pool.\n# TYPE vivarium_pool_hits_total counter\nvivarium_pool_hits_total %d\n", hits)
	fmt.Fprintf(w, "# HELP vivarium_pool_misses_total Sandboxes made on demand because the pool was empty.\n# TYPE vivarium_pool_misses_total counter\nvivarium_pool_misses_total %d\n", misses)
	fmt.Fprintf(w, "# HELP vivarium_pool_evictions_total Configurations dropped to make room for another of their key's (serve --pool-configs).\n# TYPE vivarium_pool_evictions_total counter\nvivarium_pool_evictions_total %d\n", evicted)
}
