package bench

import (
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/hostmem"
)

// The projection is N live plus what is left over what one more takes,
// the lowest bound first; a sandbox takes the larger of its PSS (with its
// zygote's share) and what its cgroup is charged.
func TestCensusBounds(t *testing.T) {
	const total = 4 << 30
	for _, tc := range []struct {
		name       string
		c          census
		want       int
		wantReason string
	}{
		{"memory at PSS", census{live: 10, groups: 12, pss: 12 * 8 << 20,
			memAvailable: hostmem.Reserve(total) + 80<<20, memTotal: total}, 20, "8.0 MiB a sandbox: its PSS"},
		{"with a zygote's share", census{live: 10, groups: 12, pss: 12 * 7 << 20, zygotes: 2, zygoteCharge: 2 * 256 << 20,
			memAvailable: hostmem.Reserve(total) + 80<<20, memTotal: total}, 20, "8.0 MiB a sandbox: 7.0 MiB its PSS, and 1.00 MiB of its zygote's 256 MiB"},
		{"memory at the cgroup's charge", census{live: 10, groups: 12, pss: 12 * 7 << 20, chargeBefore: 1 << 30, charge: 1<<30 + 10*16<<20,
			memAvailable: hostmem.Reserve(total) + 80<<20, memTotal: total}, 15, "16.0 MiB a sandbox: charged to the server's cgroup (PSS 7.0 MiB)"},
		{"the server's ceiling", census{live: 10, groups: 10, pss: 10 * 8 << 20, chargeBefore: 1<<30 - 10*8<<20, charge: 1 << 30, ceiling: 1<<30 + 16<<20,
			memAvailable: total, memTotal: total}, 12, "--max-memory-total"},
		{"the server's open files", census{live: 100, groups: 100, pss: 100 << 20, serverFilesBefore: 50, serverFiles: 1350,
			serverMaxFiles: 1400, memAvailable: total, memTotal: total}, 103, "the server's open files (limit 1400, 13 a sandbox)"},
		{"a server's defaults", census{live: 10, groups: 10, pss: 10 << 20, memAvailable: total, memTotal: total},
			defaultMaxSandboxes, "--max-sandboxes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := tc.c.bounds()
			if bs[0].n != tc.want || !strings.Contains(bs[0].what, tc.wantReason) {
				t.Errorf("bound by %d (%s), want %d (%s)", bs[0].n, bs[0].what, tc.want, tc.wantReason)
			}
			for i := 1; i < len(bs); i++ {
				if bs[i].n < bs[i-1].n {
					t.Errorf("bounds out of order: %v", bs)
				}
			}
		})
	}
}
