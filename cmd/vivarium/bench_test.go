package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/bench"
	"github.com/vivarium-sandbox/vivarium/test/testserver"
)

// buildVivarium builds the real binary: the bench times `vivarium run` as
// a process of its own, which the test binary cannot stand in for.
func buildVivarium(t *testing.T) string { return testserver.Build(t) }

func runBench(t *testing.T, exe string, args ...string) (stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(exe, append([]string{"bench"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		// What failed first: a long report may be cut short where it is
		// shown, and its failures are the last lines of stderr.
		var problems []string
		for _, line := range strings.Split(errb.String(), "\n") {
			if strings.HasPrefix(line, "vivarium bench: ") {
				problems = append(problems, line)
			}
		}
		t.Fatalf("vivarium bench %s: %v\n%s\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err,
			strings.Join(problems, "\n"), out.String(), errb.String())
	}
	return out.String(), errb.String()
}

// A measured row of the table: subject, n, p50, p95, mean, min, errors, ratio.
var tableRow = regexp.MustCompile(`^  [* ] (.+?)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\d+)\s+(\d+\.\d+x|\d+x|-)$`)

// TestBenchShort runs the whole bench as CI would, against the real binary
// and backend and whatever peers this host has. It checks the report's
// shape, not the figures: benchmarks are never timed assertions.
func TestBenchShort(t *testing.T) {
	needSandbox(t)
	exe := buildVivarium(t)
	stdout, stderr := runBench(t, exe, "--short")

	ratios := map[string]string{} // "W1 / subject" -> ratio
	workload := ""
	for _, line := range strings.Split(stdout, "\n") {
		if strings.HasPrefix(line, "W") {
			workload, _, _ = strings.Cut(line, " ")
		}
		if m := tableRow.FindStringSubmatch(line); m != nil {
			ratios[workload+" / "+m[1]] = m[8]
		}
	}
	numeric := regexp.MustCompile(`^\d+(\.\d+)?x$`)
	for row, want := range map[string]string{
		"W1 / vivarium serve, HTTP one-shot":       "1.00x",
		"W1 / vivarium run -c (CLI)":               "",
		"W1 / vivarium RunOnce (in-process)":       "",
		"W1 / python3 -c (no isolation)":           "",
		"W3 / vivarium serve, HTTP execute (warm)": "1.00x",
		"W4 / vivarium serve, POST /v1/sandboxes":  "1.00x",
		// Fairness between keys: value rows, in milliseconds.
		"W6 / quiet key alone (--tenant-share)":                        "1.00x",
		"W6 / beside a key of 8 busy sandboxes (--tenant-share)":       "",
		"W6 / beside a key of 8 busy sandboxes (--tenant-share=false)": "",
	} {
		got, ok := ratios[row]
		switch {
		case !ok:
			t.Errorf("no measured row %q in the table", row)
		case want != "" && got != want:
			t.Errorf("%s: ratio %s, want %s", row, got, want)
		case !numeric.MatchString(got):
			t.Errorf("%s: ratio %q is not a number", row, got)
		}
	}
	// The memory row is printed in its own unit.
	if !regexp.MustCompile(`\* vivarium serve, 20 idle sandboxes at once\s+\d+\s+[\d.]+ MiB`).MatchString(stdout) {
		t.Error("no memory row for idle sandboxes")
	}
	// So is the projection of how many the host holds, with its bound.
	if !regexp.MustCompile(`idle sandboxes this host holds: a projection from the 20 live\s+\d+\s+\d+ sandboxes.*\n\s+projected from 20 live: bound by `).MatchString(stdout) {
		t.Error("no projection of the idle sandboxes the host holds, or no bound named")
	}
	if !strings.Contains(stdout, "ratio = the row's p50 / the p50 of its workload's Vivarium row") {
		t.Error("the table does not say which way ratios go")
	}
	if t.Failed() {
		t.Logf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	}
}

// TestBenchJSON checks the JSON report of a small selection: the Vivarium
// reference rows come along with the rows --only selects.
func TestBenchJSON(t *testing.T) {
	needSandbox(t)
	exe := buildVivarium(t)
	stdout, _ := runBench(t, exe, "--json", "-n", "1", "--warmup", "0", "--only", `W1 .*/ python3`)
	var rep bench.Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("not a report: %v\n%s", err, stdout)
	}
	if len(rep.Latency) != 2 {
		t.Fatalf("rows %+v, want the W1 reference and python3", rep.Latency)
	}
	ref, py := rep.Latency[0], rep.Latency[1]
	if !ref.Reference || ref.Peer || ref.N != 1 || ref.Ratio != 1 {
		t.Errorf("reference row %+v", ref)
	}
	if !py.Peer || py.N != 1 || py.Ratio <= 0 || py.Versus != ref.Subject || py.P50 <= 0 {
		t.Errorf("python3 row %+v", py)
	}
	if rep.Host.CPUs < 1 || rep.Host.Kernel == "" {
		t.Errorf("host %+v", rep.Host)
	}
}
