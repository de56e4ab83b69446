package testutil

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ProcessesOwnedBy lists host processes whose real uid lies in
// [lo, hi): what is left of sandboxes whose users map there.
func ProcessesOwnedBy(lo, hi int) []string {
	var out []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		f, err := os.Open(filepath.Join(d, "status"))
		if err != nil {
			continue
		}
		var name string
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := sc.Text()
			if v, ok := strings.CutPrefix(line, "Name:"); ok {
				name = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, "Uid:"); ok {
				fields := strings.Fields(v)
				if len(fields) > 0 {
					if uid, err := strconv.Atoi(fields[0]); err == nil && uid >= lo && uid < hi {
						out = append(out, fmt.Sprintf("%s (pid %s, uid %d)", name, filepath.Base(d), uid))
					}
				}
				break
			}
		}
		f.Close()
	}
	return out
}

// CgroupsUnder lists the groups left under parent in every mounted cgroup
// hierarchy.
func CgroupsUnder(parent string) []string {
	var out []string
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	for _, r := range roots {
		entries, err := os.ReadDir(filepath.Join(r, parent))
		if err != nil {
			continue
		}
		for _, e := range entries {
			if e.IsDir() {
				out = append(out, filepath.Join(r, parent, e.Name()))
			}
		}
	}
	return out
}

// MountCount is the number of mounts in this process's mount namespace.
func MountCount() int {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return -1
	}
	return strings.Count(string(b), "\n")
}
