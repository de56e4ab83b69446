// Package hostmem reads the host's memory (/proc/meminfo) and says
// whether more of it can be spent: what forks and a cluster's nodes ask.
package hostmem

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Read returns the host's available and total memory in bytes
// (MemAvailable and MemTotal).
func Read() (available, total int64, err error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, err
	}
	available = -1
	for _, l := range strings.Split(string(b), "\n") {
		// MemTotal:       24588536 kB
		k, v, ok := strings.Cut(l, ":")
		f := strings.Fields(v)
		if !ok || len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "MemAvailable":
			available = n << 10
		case "MemTotal":
			total = n << 10
		}
	}
	if total == 0 || available < 0 {
		return 0, 0, errors.New("no MemTotal or MemAvailable in /proc/meminfo")
	}
	return available, total, nil
}

// Reserve is what the host keeps free of its total memory: 5%, at least
// 256 MiB.
func Reserve(total int64) int64 { return max(256<<20, total/20) }

// DefaultCeilings are the default bounds on sandboxes' memory on a host
// of total bytes, rounded down to MiB: all of a server's together keep
// the host its Reserve (a host too small for it keeps half); one
// tenant's (an API key's) together take at most half of it, the largest
// share that still leaves every other tenant as much as one tenant may
// take.
func DefaultCeilings(total int64) (all, perTenant int64) {
	const mib = 1 << 20
	half := total / 2 / mib * mib
	return max(half, (total-Reserve(total))/mib*mib), half
}

// Fits fails with sandbox.ErrNoRoom when need bytes more would leave the
// host (available and total memory, as Read gives them) less than its
// Reserve; what is asked for is named in the error (copies: "the
// copies").
func Fits(need, available, total int64, what string) error {
	if reserve := Reserve(total); available-need < reserve {
		return fmt.Errorf("%w: %s would take about %d MiB of the host's memory, which has %d MiB available "+
			"and keeps %d MiB free: make fewer", sandbox.ErrNoRoom, what, need>>20, available>>20, reserve>>20)
	}
	return nil
}

// Room is Fits for the host's memory as read reads it now (Read, or a
// test's stand-in): what a fork's copies ask before they are made, so
// that they are not left to the host's OOM killer among every tenant's
// processes. Where the memory cannot be read, nothing is refused: what
// asks is still bounded by its own limits.
func Room(read func() (available, total int64, err error), need int64, what string) error {
	available, total, err := read()
	if err != nil {
		return nil
	}
	return Fits(need, available, total, what)
}
