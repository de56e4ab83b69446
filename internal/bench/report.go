package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Report is the outcome of a bench run.
type Report struct {
	Date        string          `json:"date"`
	Host        Host            `json:"host"`
	Iterations  int             `json:"iterations"`
	WarmUp      int             `json:"warm_up"`
	Concurrency int             `json:"concurrency,omitempty"`
	Duration    Millis          `json:"duration_ms,omitempty"`
	Latency     []Row           `json:"latency"`
	Throughput  []ThroughputRow `json:"throughput,omitempty"`
	// Values are rows of quantities other than time.
	Values []Row `json:"values,omitempty"`
}

// Row is one subject's latency, or another quantity (Unit).
type Row struct {
	Workload  string `json:"workload"`
	Subject   string `json:"subject"`
	Peer      bool   `json:"peer"`
	Optional  bool   `json:"optional,omitempty"`
	Reference bool   `json:"reference"`
	// Unit of the Stats: "ms" for latency rows.
	Unit string `json:"unit"`
	// Skipped says why the subject did not run (not available here).
	Skipped string `json:"skipped,omitempty"`
	// Failed: the subject was available but no iteration succeeded.
	Failed bool `json:"failed,omitempty"`
	Stats
	Errors     int    `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
	// Note says what the value means that the row's name cannot
	// (Subject.Note).
	Note string `json:"note,omitempty"`
	// Ratio is P50 over the reference row's P50: for latency, 2 means
	// twice as slow as Vivarium. Zero when there is nothing to compare.
	Ratio float64 `json:"ratio,omitempty"`
	// Versus names the reference row Ratio was taken against.
	Versus string `json:"versus,omitempty"`
}

func (r *Row) measured() bool { return r.Skipped == "" && !r.Failed && r.N > 0 }

// computeRatios fills Ratio and Versus of every row of a workload that has
// a measured reference row, the reference's own included (1x).
func (r *Report) computeRatios() {
	ratios(r.Latency)
	ratios(r.Values)
	tpRefs := map[string]*ThroughputRow{}
	for i := range r.Throughput {
		if tp := &r.Throughput[i]; tp.Reference && tp.PerSecond > 0 {
			tpRefs[tp.Workload] = tp
		}
	}
	for i := range r.Throughput {
		tp := &r.Throughput[i]
		if ref := tpRefs[tp.Workload]; ref != nil {
			tp.Ratio = tp.PerSecond / ref.PerSecond
		}
	}
}

func ratios(rows []Row) {
	refs := map[string]*Row{}
	for i := range rows {
		if row := &rows[i]; row.Reference && row.measured() {
			refs[row.Workload+"\x00"+row.Unit] = row
		}
	}
	for i := range rows {
		row := &rows[i]
		if ref := refs[row.Workload+"\x00"+row.Unit]; ref != nil && row.measured() && ref.P50 > 0 {
			row.Ratio = row.P50 / ref.P50
			row.Versus = ref.Subject
		}
	}
}

// VivariumProblems lists what went wrong with Vivarium's own rows (peers
// are left out: a missing or broken peer is not Vivarium's failure). The
// bench command exits with an error when it is not empty.
func (r *Report) VivariumProblems() []string {
	var out []string
	for _, row := range slices.Concat(r.Latency, r.Values) {
		switch {
		case row.Peer, row.Optional && row.Skipped != "":
		case row.Skipped != "":
			out = append(out, fmt.Sprintf("%s / %s: skipped: %s", row.Workload, row.Subject, row.Skipped))
		case row.Failed || row.Errors > 0:
			out = append(out, fmt.Sprintf("%s / %s: %d errors: %s", row.Workload, row.Subject, row.Errors, row.FirstError))
		}
	}
	for _, tp := range r.Throughput {
		if !tp.Peer && (tp.Errors > 0 || tp.Completed == 0) {
			out = append(out, fmt.Sprintf("%s / %s: throughput: %d errors: %s", tp.Workload, tp.Subject, tp.Errors, tp.FirstError))
		}
	}
	return out
}

// WriteJSON writes the report as one indented JSON object.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(r)
}

// WriteTable writes the report for people: a header saying what was
// measured and which way ratios go, then a table per workload.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "vivarium bench, %s: %s\n", r.Date, r.Host)
	width := len("subject")
	for _, row := range slices.Concat(r.Latency, r.Values) {
		width = max(width, len(row.Subject))
	}

	if len(r.Latency) > 0 {
		fmt.Fprintf(&b, "\nLatency of one execution, end to end (start, run, check the output, clean up):\n")
		fmt.Fprintf(&b, "%d measured runs per row after %d warm-up %s, never two at once; the rows of a workload take turns.\n",
			r.Iterations, r.WarmUp, plural(r.WarmUp, "run", "runs"))
		b.WriteString("ratio = the row's p50 / the p50 of its workload's Vivarium row (marked *):\n" +
			"        above 1x the row takes longer than Vivarium, below 1x less (0.50x: half the time).\n")
		writeRows(&b, r.Latency, width)
	}
	if len(r.Throughput) > 0 {
		fmt.Fprintf(&b, "\nThroughput: %d concurrent %s, each running executions back to back for %s.\n",
			r.Concurrency, plural(r.Concurrency, "client", "clients"), r.Duration.D().Round(time.Millisecond))
		b.WriteString("ratio = the row's executions/s / its workload's Vivarium row's (marked *):\n" +
			"        above 1x the row completes more executions per second than Vivarium, below 1x fewer.\n")
		for _, wl := range workloads(r.Throughput, func(tp ThroughputRow) string { return tp.Workload }) {
			fmt.Fprintf(&b, "\n%s\n", wl)
			fmt.Fprintf(&b, "    %-*s %7s %9s %8s %4s %7s\n", width, "subject", "clients", "completed", "exec/s", "err", "ratio")
			for _, tp := range r.Throughput {
				if tp.Workload != wl {
					continue
				}
				mark := " "
				if tp.Reference {
					mark = "*"
				}
				fmt.Fprintf(&b, "  %s %-*s %7d %9d %8.2f %4d %7s\n", mark, width, tp.Subject,
					tp.Clients, tp.Completed, tp.PerSecond, tp.Errors, formatRatio(tp.Ratio))
				if tp.Errors > 0 {
					fmt.Fprintf(&b, "      first error: %s\n", oneLine(tp.FirstError))
				}
			}
		}
	}
	if len(r.Values) > 0 {
		b.WriteString("\nOther measurements, per row in its unit; ratio = the row's p50 / its workload's Vivarium row's p50.\n")
		writeRows(&b, r.Values, width)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeRows writes a table per workload.
func writeRows(b *strings.Builder, rows []Row, width int) {
	for _, wl := range workloads(rows, func(row Row) string { return row.Workload }) {
		fmt.Fprintf(b, "\n%s\n", wl)
		fmt.Fprintf(b, "    %-*s %4s %9s %9s %9s %9s %4s %7s\n", width, "subject", "n", "p50", "p95", "mean", "min", "err", "ratio")
		for _, row := range rows {
			if row.Workload != wl {
				continue
			}
			mark := " "
			if row.Reference {
				mark = "*"
			}
			fmt.Fprintf(b, "  %s %-*s ", mark, width, row.Subject)
			switch {
			case row.Skipped != "":
				fmt.Fprintf(b, "skipped: %s\n", row.Skipped)
				continue
			case row.Failed:
				fmt.Fprintf(b, "failed: %s\n", oneLine(row.FirstError))
				continue
			}
			fmt.Fprintf(b, "%4d %9s %9s %9s %9s %4d %7s\n", row.N,
				formatValue(row.P50, row.Unit), formatValue(row.P95, row.Unit),
				formatValue(row.Mean, row.Unit), formatValue(row.Min, row.Unit),
				row.Errors, formatRatio(row.Ratio))
			if row.Errors > 0 {
				fmt.Fprintf(b, "      first error: %s\n", oneLine(row.FirstError))
			}
			if row.Note != "" {
				fmt.Fprintf(b, "      %s\n", row.Note)
			}
		}
	}
}

// workloads lists the workloads of rows in order of first appearance.
func workloads[R any](rows []R, workload func(R) string) []string {
	var out []string
	seen := map[string]bool{}
	for _, row := range rows {
		if wl := workload(row); !seen[wl] {
			seen[wl] = true
			out = append(out, wl)
		}
	}
	return out
}

// formatValue writes a latency (unit "ms") as formatDuration does, and
// other quantities with three significant digits and their unit.
func formatValue(v float64, unit string) string {
	if unit == "ms" {
		return formatDuration(fromMillis(v))
	}
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f %s", v, unit)
	case v >= 10:
		return fmt.Sprintf("%.1f %s", v, unit)
	default:
		return fmt.Sprintf("%.2f %s", v, unit)
	}
}

// formatDuration keeps three significant digits or so, in the unit people
// read latencies in.
func formatDuration(d time.Duration) string {
	ms := toMillis(d)
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= 100*time.Millisecond:
		return fmt.Sprintf("%.0fms", ms)
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.1fms", ms)
	default:
		return fmt.Sprintf("%.2fms", ms)
	}
}

func formatRatio(r float64) string {
	switch {
	case r == 0:
		return "-"
	case r >= 100:
		return fmt.Sprintf("%.0fx", r)
	case r >= 0.01:
		return fmt.Sprintf("%.2fx", r)
	default:
		return fmt.Sprintf("%.4fx", r)
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// oneLine keeps error messages (a traceback, a program's stderr) to one
// line of the table.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 160 {
		s = s[:157] + "..."
	}
	return s
}
