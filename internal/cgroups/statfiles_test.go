//go:build linux

package cgroups

import (
	"bufio"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// A group's accounting is read through descriptors it holds from its
// first read until it is destroyed: later reads open nothing (here, with
// no descriptor to spare), and see the values of now.
func TestRealGroupStatsHoldTheirFiles(t *testing.T) {
	testutil.RequireRoot(t)
	py := testutil.RequirePython(t)
	m, err := Detect("vivarium-test")
	if err != nil {
		t.Skipf("no usable cgroups: %v", err)
	}
	g, err := m.New("held-stats", Limits{MemoryBytes: 64 << 20, Pids: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Destroy()
	cmd := exec.Command(py, "-c", `
import sys
sys.stdin.read(1)
sum(range(5000000))
print("burnt", flush=True)
sys.stdin.read(1)`)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if err := g.AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	open := openFiles(t)
	before, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}

	// No descriptor to spare: an open fails with EMFILE from here on.
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	free, err := syscall.Dup(0)
	if err != nil {
		t.Fatal(err)
	}
	syscall.Close(free)
	tight := lim
	tight.Cur = uint64(free)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &tight); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Open("/proc/self/status"); err == nil {
		t.Fatal("an open succeeded under the tightened limit")
	}
	stdin.Write([]byte("x"))
	line, rerr := bufio.NewReader(stdout).ReadString('\n')
	after, err := g.Stats()
	if serr := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); serr != nil {
		t.Fatal(serr)
	}
	if rerr != nil || line != "burnt\n" {
		t.Fatalf("the process said %q (%v)", line, rerr)
	}
	if err != nil {
		t.Fatalf("Stats with no descriptor to spare: %v", err)
	}
	if after.CPU <= before.CPU {
		t.Errorf("CPU %v, then %v after the process burnt some: a held file read an old value", before.CPU, after.CPU)
	}

	if err := g.Destroy(); err != nil {
		t.Fatal(err)
	}
	if n := openFiles(t); n != open {
		t.Errorf("%d descriptors open after Destroy, %d before the group's first read", n, open)
	}
}

// openFiles counts this process's open descriptors.
func openFiles(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries) - 1 // ReadDir's own
}

// What reading a group's accounting costs (an execution reads it twice):
// through the descriptors it holds, and opening each file by its path.
func BenchmarkGroupStats(b *testing.B) {
	testutil.RequireRoot(b)
	m, err := Detect("vivarium-test")
	if err != nil {
		b.Skipf("no usable cgroups: %v", err)
	}
	g, err := m.New("bench-stats", Limits{MemoryBytes: 64 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Destroy()
	b.Run("held", func(b *testing.B) {
		for range b.N {
			if _, err := g.Stats(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("by-path", func(b *testing.B) {
		var read func() (Stats, error)
		switch g := g.(type) {
		case *group1:
			read = func() (Stats, error) { return statsV1(byPath{}, g.dir(g.m.cpuacct), g.dir(g.m.memory)) }
		case *group2:
			read = func() (Stats, error) { return statsV2(byPath{}, g.dir) }
		}
		for range b.N {
			if _, err := read(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
