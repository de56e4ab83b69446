package bench

import (
	"fmt"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/hostmem"
)

// Host describes the machine a report was measured on: figures from
// different machines are not comparable, ratios from one run are.
type Host struct {
	Kernel      string `json:"kernel"`
	Arch        string `json:"arch"`
	CPUs        int    `json:"cpus"`
	MemoryBytes int64  `json:"memory_bytes"`
	Cgroup      string `json:"cgroup"` // "v2", "v1 (hybrid)" or "v1"
	// Load is /proc/loadavg's 1, 5 and 15-minute averages when the report
	// was made: other work on the machine shows in every figure, if not
	// in the ratios to the same degree.
	Load     string `json:"load,omitempty"`
	Vivarium string `json:"vivarium,omitempty"`
}

func (h Host) String() string {
	s := fmt.Sprintf("Linux %s %s, %d %s, %.1f GiB, cgroup %s", h.Kernel, h.Arch, h.CPUs,
		plural(h.CPUs, "CPU", "CPUs"), float64(h.MemoryBytes)/(1<<30), h.Cgroup)
	if h.Load != "" {
		s += ", load " + h.Load
	}
	if h.Vivarium != "" {
		s += ", vivarium " + h.Vivarium
	}
	return s
}

// ReadHost describes this machine.
func ReadHost() Host {
	var uts unix.Utsname
	unix.Uname(&uts)
	return Host{
		Kernel:      unix.ByteSliceToString(uts.Release[:]),
		Arch:        runtime.GOARCH,
		CPUs:        runtime.NumCPU(),
		MemoryBytes: memTotal(),
		Cgroup:      cgroupMode(),
		Load:        loadAverage(),
	}
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return ""
}

func memTotal() int64 {
	_, total, _ := hostmem.Read()
	return total
}

func cgroupMode() string {
	isV2 := func(path string) bool {
		var st unix.Statfs_t
		return unix.Statfs(path, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
	}
	switch {
	case isV2("/sys/fs/cgroup"):
		return "v2"
	case isV2("/sys/fs/cgroup/unified"):
		return "v1 (hybrid)"
	default:
		return "v1"
	}
}
