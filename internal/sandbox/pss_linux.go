package sandbox

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ProcessPSS reads a process's proportional set size in bytes, the measure
// MemoryUser reports (0 if the process is gone).
func ProcessPSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Pss:"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// ProcessesPSS is the sum of the processes' proportional set sizes.
func ProcessesPSS(pids []int) int64 {
	var total int64
	for _, pid := range pids {
		total += ProcessPSS(pid)
	}
	return total
}
