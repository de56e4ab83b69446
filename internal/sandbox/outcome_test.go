package sandbox

import (
	"strings"
	"testing"
)

// An OOM kill is the memory limit; where the sandbox held well under its
// own limit, the message says a ceiling above it was reached instead.
func TestClassifyMemory(t *testing.T) {
	o := Outcome{Dead: true, OOM: true, Limits: Limits{Memory: 512 << 20}}
	for peak, want := range map[int64]string{
		0:         "exceeded its 512 MiB memory limit",
		500 << 20: "exceeded its 512 MiB memory limit",
		100 << 20: "ran out of memory at 100 MiB, under its own 512 MiB limit",
	} {
		res := &Result{PeakMemoryBytes: peak}
		o.Classify(res)
		if res.Status != StatusMemoryLimit || res.ExitCode != ExitMemoryLimit || res.Error == nil ||
			!strings.Contains(res.Error.Value, want) {
			t.Errorf("peak %d MiB: %s %d %+v, want %q", peak>>20, res.Status, res.ExitCode, res.Error, want)
		}
	}
}
