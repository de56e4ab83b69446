package testutil

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// ProcessesOwnedBy lists host processes whose real uid lies in
// [lo, hi): what is left of sandboxes whose users map there. A zygote's own
// processes (in a "zygote-" cgroup) live as long as their backend and are
// not counted; ZygoteProcesses lists them.
func ProcessesOwnedBy(lo, hi int) []string {
	return processesOwnedBy(lo, hi, false)
}

// ZygoteProcesses lists the processes of zygotes whose users map into
// [lo, hi).
func ZygoteProcesses(lo, hi int) []string {
	return processesOwnedBy(lo, hi, true)
}

func inZygote(pid string) bool {
	b, _ := os.ReadFile(filepath.Join("/proc", pid, "cgroup"))
	return strings.Contains(string(b), "/zygote-")
}

func processesOwnedBy(lo, hi int, zygotes bool) []string {
	var out []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		if inZygote(filepath.Base(d)) != zygotes {
			continue
		}
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
			// A zygote's group lives as long as its backend.
			if e.IsDir() && !strings.HasPrefix(e.Name(), "zygote-") {
				out = append(out, filepath.Join(r, parent, e.Name()))
			}
		}
	}
	return out
}

// RemoveStaleCgroups removes the empty groups under parent: what a test
// binary that was killed left (its sandboxes died with it, their groups
// stayed). Groups with members stay, and nothing is killed, so that a run
// of the same suite going on at once is left alone.
func RemoveStaleCgroups(parent string) {
	groups := CgroupsUnder(parent)
	// Children before their parents.
	sort.Slice(groups, func(i, j int) bool { return len(groups[i]) > len(groups[j]) })
	for _, g := range groups {
		sub, _ := filepath.Glob(filepath.Join(g, "*", "cgroup.procs"))
		for _, s := range sub {
			os.Remove(filepath.Dir(s))
		}
		os.Remove(g) // EBUSY while it has members
	}
}

// DescribeCgroups says what each group of groups (paths, as CgroupsUnder
// gives them) holds: its processes, by pid, name and state, or "empty".
func DescribeCgroups(groups []string) string {
	var out []string
	for _, g := range groups {
		b, err := os.ReadFile(filepath.Join(g, "cgroup.procs"))
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", g, err))
			continue
		}
		var procs []string
		for _, pid := range strings.Fields(string(b)) {
			stat, _ := os.ReadFile(filepath.Join("/proc", pid, "stat"))
			// pid (comm) state ...: comm may hold spaces and parentheses.
			s := string(stat)
			if i := strings.LastIndexByte(s, ')'); i > 0 && len(s) > i+2 {
				s = s[strings.IndexByte(s, '(')+1:i] + " " + s[i+2:i+3]
			}
			procs = append(procs, pid+" "+s)
		}
		if len(procs) == 0 {
			procs = []string{"empty"}
		}
		out = append(out, g+": "+strings.Join(procs, ", "))
	}
	return strings.Join(out, "; ")
}
