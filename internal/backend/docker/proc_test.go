package docker_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// procCode reads what a sandbox's /proc shows of the files the native
// backend synthesises or empties, whether the synthesised ones are on
// read-only mounts, and runs the programs that read them.
const procCode = `import json, os, subprocess
def read(p):
    try:
        with open("/proc/" + p, errors="replace") as f:
            return f.read()
    except OSError as e:
        return "error " + os.strerror(e.errno)
def listdir(p):
    try:
        return os.listdir("/proc/" + p)
    except OSError as e:
        return []
files = ["sys/kernel/random/boot_id", "meminfo", "stat", "loadavg", "cgroups", "vmstat", "swaps",
         "config.gz", "cmdline", "interrupts", "softirqs", "diskstats", "partitions", "iomem", "ioports",
         "devices", "buddyinfo", "zoneinfo", "misc", "consoles", "dma", "keys", "timer_list", "locks", "slabinfo",
         "sys/fs/file-nr", "sys/fs/inode-nr", "sys/fs/dentry-state", "sys/fs/aio-nr", "sys/kernel/pty/nr"]
dirs = ["bus", "fs", "irq", "pressure", "acpi", "sys/fs/quota"]
programs = {}
for cmd in (["ps", "aux"], ["top", "-bn1"], ["free", "-b"], ["uptime"], ["nproc"]):
    p = subprocess.run(cmd, capture_output=True, text=True)
    programs[cmd[0]] = [p.returncode, p.stderr.strip()[:300]]
print(json.dumps({"files": {p: read(p) for p in files}, "dirs": {p: listdir(p) for p in dirs},
                  "readonly": {p: bool(os.statvfs("/proc/" + p).f_flag & os.ST_RDONLY) for p in ("meminfo", "stat", "loadavg", "swaps")}, "programs": programs,
                  "cpus": [os.cpu_count(), len(os.sched_getaffinity(0))]}))
`

// testProc: a sandbox's /proc shows the sandbox, as the native backend's
// does, where runc lets a file be bound over the kernel's (meminfo, stat,
// loadavg, swaps), and is empty where it hides the host and runc lets no
// file cover it (see proc_linux.go); the programs that read it still work.
func testProc(t *testing.T, oneShot func(t *testing.T, code string, l sandbox.Limits) *sandbox.Result) {
	const memory = 200 << 20
	res := oneShot(t, procCode, sandbox.Limits{Memory: memory})
	wantStatus(t, res, sandbox.StatusOK)
	var v struct {
		Files    map[string]string
		Dirs     map[string][]string
		ReadOnly map[string]bool
		Programs map[string][2]any
		CPUs     [2]int
	}
	if err := json.Unmarshal([]byte(res.Stdout), &v); err != nil {
		t.Fatalf("%v: %s", err, res.Stdout)
	}

	meminfo := map[string]string{}
	for _, l := range strings.Split(v.Files["meminfo"], "\n") {
		if k, val, ok := strings.Cut(l, ":"); ok {
			meminfo[k] = strings.TrimSpace(val)
		}
	}
	for _, k := range []string{"MemTotal", "MemFree", "MemAvailable"} {
		if got := meminfo[k]; got != strconv.Itoa(memory>>10)+" kB" {
			t.Errorf("meminfo %s: %q, want the memory limit, %d kB", k, got, memory>>10)
		}
	}
	for _, k := range []string{"Cached", "Shmem", "Slab", "Committed_AS"} {
		if got := meminfo[k]; got != "0 kB" {
			t.Errorf("meminfo %s: %q, want 0 kB", k, got)
		}
	}

	// The CPUs the supervisor may use, which the container's are.
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	hostStat, _ := os.ReadFile("/proc/stat")
	btime := regexp.MustCompile(`(?m)^btime .*$`).FindString(string(hostStat))
	cpus := 0
	for _, l := range strings.Split(strings.TrimSpace(v.Files["stat"]), "\n") {
		name, rest, _ := strings.Cut(l, " ")
		switch {
		case name == "btime":
			if l != btime {
				t.Errorf("stat: %q, want the host's %q (the start times in /proc/PID/stat count from it)", l, btime)
			}
		case name == "procs_running":
		case strings.Trim(rest, "0 ") != "":
			t.Errorf("stat: %q, want zeros", l)
		}
		if strings.HasPrefix(name, "cpu") && name != "cpu" {
			cpus++
		}
	}
	if cpus != set.Count() || v.CPUs != [2]int{set.Count(), set.Count()} {
		t.Errorf("stat has %d CPUs, os.cpu_count and the affinity say %v, want %d", cpus, v.CPUs, set.Count())
	}
	if l := v.Files["loadavg"]; l != "0.00 0.00 0.00 1/1 1\n" {
		t.Errorf("loadavg %q: want the sandbox's, not the host's", l)
	}
	if want := "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"; v.Files["swaps"] != want {
		t.Errorf("swaps %q, want no swap", v.Files["swaps"])
	}
	// Emptied: what the native backend hides, and what it synthesises
	// where runc lets no file cover the kernel's.
	for _, p := range []string{"sys/kernel/random/boot_id", "cgroups", "vmstat", "config.gz", "cmdline", "interrupts",
		"softirqs", "diskstats", "partitions", "iomem", "ioports", "devices", "buddyinfo", "zoneinfo", "misc", "consoles",
		"dma", "keys", "timer_list", "locks", "slabinfo", "sys/fs/file-nr", "sys/fs/inode-nr", "sys/fs/dentry-state",
		"sys/fs/aio-nr", "sys/kernel/pty/nr"} {
		if got := v.Files[p]; got != "" && !strings.HasPrefix(got, "error ") {
			t.Errorf("/proc/%s: %.80q, want it empty or absent", p, got)
		}
	}
	for p, names := range v.Dirs {
		if len(names) > 0 {
			t.Errorf("/proc/%s: %v, want it empty or absent", p, names)
		}
	}
	// Bound from the view's read-only overlay.
	for p, ro := range v.ReadOnly {
		if !ro {
			t.Errorf("/proc/%s is on a writable mount", p)
		}
	}
	for name, r := range v.Programs {
		if r[0] != 0.0 || r[1] != "" {
			t.Errorf("%s: exit %v, stderr %q", name, r[0], r[1])
		}
	}
}
