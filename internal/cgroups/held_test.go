package cgroups

import (
	"os"
	"path/filepath"
	"testing"
)

// MemoryHeld leaves out the files' page cache, reads "max" and v1's
// "none" as no limit, and a tenant without a group as holding nothing,
// on both versions' files.
func TestMemoryHeld(t *testing.T) {
	write := func(dir string, files map[string]string) {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, v := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	root := t.TempDir()
	one := &v1{memory: filepath.Join(root, "memory"), parent: "srv"}
	write(filepath.Join(one.memory, "srv"), map[string]string{"memory.usage_in_bytes": "1000\n",
		"memory.limit_in_bytes": "4000\n", "memory.stat": "cache 300\nrss 500\ntotal_active_file 100\ntotal_inactive_file 200\n"})
	write(filepath.Join(one.memory, "srv", "alice"), map[string]string{"memory.usage_in_bytes": "700\n",
		"memory.limit_in_bytes": "9223372036854771712\n", "memory.stat": "total_active_file 0\ntotal_inactive_file 50\n"})
	two := &v2{root: filepath.Join(root, "unified"), parent: "srv"}
	write(filepath.Join(two.root, "srv"), map[string]string{"memory.current": "1000\n", "memory.max": "max\n",
		"memory.stat": "anon 500\nactive_file 100\ninactive_file 200\nshmem 100\n"})

	for _, c := range []struct {
		name        string
		m           Manager
		tenant      string
		held, limit int64
	}{
		{"v1 parent", one, "", 700, 4000},
		{"v1 tenant without a limit", one, "alice", 650, 0},
		{"v1 tenant without a group", one, "bob", 0, 0},
		{"v2 parent without a limit", two, "", 700, 0},
	} {
		held, limit, err := MemoryHeld(c.m, c.tenant)
		if err != nil || held != c.held || limit != c.limit {
			t.Errorf("%s: %d held of %d, %v; want %d of %d", c.name, held, limit, err, c.held, c.limit)
		}
	}
	if _, _, err := MemoryHeld(one, "../x"); err == nil {
		t.Errorf("a tenant name that leaves the parent was read")
	}
}
