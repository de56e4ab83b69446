//go:build linux

package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestUsageOf reads a sandbox's usage from its group's accounting files,
// and names a sandbox without a group of Vivarium's as such.
func TestUsageOf(t *testing.T) {
	if _, err := UsageOf(nil); !errors.Is(err, ErrNoGroup) {
		t.Fatalf("UsageOf(nil) = %v, want ErrNoGroup", err)
	}
	fakeKernel(t, v2Files)
	root := fakeV2(t)
	m, err := newV2(root, "vivarium")
	if err != nil {
		t.Fatal(err)
	}
	g, err := m.New("sb1", Limits{MemoryBytes: 64 << 20, Pids: 7})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "vivarium", "sb1")
	for f, body := range map[string]string{"cpu.stat": "usage_usec 2500\n", "memory.current": "12345678\n",
		"memory.peak": "23456789\n", "memory.events": "oom_kill 0\n"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	u, err := UsageOf(g)
	if err != nil {
		t.Fatal(err)
	}
	if u.CPU != 2500*time.Microsecond || u.Memory != 12345678 {
		t.Errorf("usage = %+v, want 2.5ms of CPU and 12345678 bytes", u)
	}
}
