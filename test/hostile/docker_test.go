//go:build linux

package hostile

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/container"
	"github.com/vivarium-sandbox/vivarium/internal/hostuid"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil/testbackends"
)

// The docker sandboxes' host uids: a pool of the suite's own, apart from
// other suites' (see testbackends.DockerUIDs). Every sandbox is a host
// user of its own, id SandboxUID of one of its ranges.
var (
	dockerUIDBase, dockerUIDEnd = testbackends.DockerUIDs(suite.UIDBase)
	dockerUIDRanges             = int(dockerUIDEnd-dockerUIDBase) / hostuid.RangeSize
)

// dockerUID is the uid of the pool that text (from the sandbox) names, or
// -1.
func dockerUID(text string) int {
	uid, err := strconv.Atoi(text)
	if off := uid - int(dockerUIDBase); err != nil || off < 0 || uid >= int(dockerUIDEnd) ||
		off%hostuid.RangeSize != container.SandboxUID {
		return -1
	}
	return uid
}

// dockerDifferences are the cases whose safe outcome differs in a Docker
// container, and why. The container is made by Docker and runc: its /dev
// and /sys are Docker's (Vivarium empties /sys and makes /dev read-only,
// but cannot choose the devices), Docker's seccomp profile runs under
// Vivarium's filter, and there is no user namespace: the sandbox user is
// a host uid of the sandbox's own, not 1000. The attack still fails in
// every case.
var dockerDifferences = withReadOnlyRoot(map[string]difference{
	"volume_escape":           {why: noVolumes},
	"volume_pass_descriptors": {why: noVolumes},
	"fork_bomb": {why: "the pids limit stops the forks, but a container's interpreters fault in their copied pages " +
		"faster than the native backend's: the memory limit may end the sandbox before its timeout (2 runs in 3 here); " +
		"either way a limit ended it, and the memory stayed within its limit",
		check: func(t *testing.T, h *harness, o *outcome) {
			if o.Status != sandbox.StatusTimeout && o.Status != sandbox.StatusMemoryLimit {
				t.Fatalf("want the timeout or the memory limit; %s", describe(o))
			}
			wantPeakWithin(t, o)
		}},
	"take_all_inotify_watches": {why: "no user namespace of its own: a container's watches are limited by the host's " +
		"per-user limit (fs.inotify.max_user_watches) for its own host user, and each watch pins an inode of the " +
		"container's /usr overlay, charged to its memory cgroup, whose limit ends the walk first (in about 6 s here); " +
		"on a loaded host the cgroup's reclaim near its limit can outlast the wall clock (once in CI), which then ends it",
		check: func(t *testing.T, h *harness, o *outcome) {
			if o.Status != sandbox.StatusMemoryLimit && o.Status != sandbox.StatusTimeout {
				if _, why := heldCount(t, o, "inotify_watches"); why != "ENOSPC" {
					t.Errorf("watches stopped with %s, want ENOSPC or the memory limit", why)
				}
			}
			neighboursNeverRefused(t)
		}},
	"become_root": {why: "no user namespace: the sandbox user is a host uid of its own (named sandbox), not 1000",
		check: func(t *testing.T, h *harness, o *outcome) {
			f := strings.Fields(strings.SplitN(o.Stdout, "\n", 2)[0])
			uid := -1
			if len(f) > 1 {
				uid = dockerUID(f[1])
			}
			if uid < 0 {
				t.Fatalf("the sandbox user is not of the pool (%d to %d): %q", dockerUIDBase, dockerUIDEnd, o.Stdout)
			}
			wantOK(t, o, lines(fmt.Sprintf("uid %[1]d %[1]d gid %[1]d groups []", uid), "setuid 0 EPERM",
				"seteuid 0 EPERM", "setresuid 0 EPERM", "setgid 0 EPERM", "setgroups [0] EPERM",
				fmt.Sprintf("fsuid after setfsuid(0) %d", uid)))
		}},
	"kill_processes_outside": {why: "the sandbox user is a host uid of its own, which the sandbox learns only once " +
		"it runs: a host victim runs as the sandbox user of every range of the pool, and the code attacks its own",
		edit: func(code string) string {
			return strings.Replace(code, `int(os.environ["VICTIM_PID"])`, `int(os.environ["VICTIM_PID_%d" % os.getuid()])`, 1)
		},
		prepare: func(t *testing.T, h *harness, j *job) {
			for k := range dockerUIDRanges {
				uid := int(dockerUIDBase) + k*hostuid.RangeSize + container.SandboxUID
				victim := exec.Command("sleep", "60")
				victim.SysProcAttr = &syscall.SysProcAttr{
					Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)},
					Setsid:     true,
				}
				if err := victim.Start(); err != nil {
					t.Fatal(err)
				}
				exited := make(chan struct{})
				go func() { victim.Wait(); close(exited) }()
				t.Cleanup(func() {
					victim.Process.Kill()
					<-exited
				})
				j.vars[fmt.Sprintf("VICTIM_PID_%d", uid)] = fmt.Sprint(victim.Process.Pid)
			}
			j.vars["HOST_PID"] = fmt.Sprint(os.Getpid())
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("kill host victim ESRCH", "killpg host victim ESRCH", "kill host test process ESRCH",
				"kill -1 ESRCH", "pidfd_open host victim ESRCH", "survived"))
			for name, v := range o.vars {
				if pid, _ := strconv.Atoi(v); strings.HasPrefix(name, "VICTIM_PID_") && !alive(pid) {
					t.Errorf("the host victim %s (pid %d) died", name, pid)
				}
			}
		}},
	"seccomp_personality": {why: "Docker's seccomp profile, under Vivarium's filter, refuses libc's personality(" +
		"0xffffffff) query (its rule compares the whole 64-bit argument, which libc passes sign-extended): the " +
		"persona is read from /proc/self/personality instead",
		edit: func(code string) string {
			return strings.Replace(code, "_libc.personality(0xffffffff)", `int(open("/proc/self/personality").read(), 16)`, 1)
		}},
	"host_ptys_bounded": {why: "/dev/pts is Docker's devpts instance, mounted without max= (Docker's API cannot set " +
		"it, and the container cannot remount it): a docker sandbox's ptys are bounded by its descriptors and " +
		"processes only, within the pool all devpts instances but the host's own share (kernel.pty.max less " +
		"kernel.pty.reserve); the host keeps its reserve",
		check: want("unbounded", "listed 64", "after closing one True", "TIOCSTI on a pty EPERM")},
	"host_directories_not_visible": {why: "Docker always mounts something at /sys: the sandbox's is an empty " +
		"read-only tmpfs, with an empty one at /sys/fs/cgroup that keeps Docker's cgroup mounts out",
		check: want("host dirs ['sys']", "run None", "root is /workspace", "var ['tmp']", "home ['user'] /workspace",
			"/sys/fs/cgroup ok", "/sys/kernel ENOENT", "/run/user ENOENT", "/var/lib ENOENT", "/var/log ENOENT",
			"/boot ENOENT")},
	"proc_reveals_host": {why: "runc lets a mount cover only the files of /proc that LXCFS emulates (meminfo, stat, " +
		"loadavg, swaps ...): the other files the native backend synthesises are emptied (Docker's MaskedPaths, a " +
		"bind of the container's /dev/null), so the boot id is empty rather than one of the sandbox's own, and " +
		"/proc/cgroups and /proc/sys/fs/file-nr are empty rather than counting the sandbox alone",
		edit: func(code string) string {
			return strings.Replace(code, "if boot is None:", "if boot == \"\":\n    print(\"boot_id empty\")\nelif boot is None:", 1)
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			want := []string{"boot_id empty", "cmdline hidden"}
			for _, p := range []string{"config.gz", "interrupts", "softirqs", "diskstats", "partitions", "iomem", "ioports",
				"devices", "buddyinfo", "zoneinfo", "locks", "bus", "fs", "irq", "pressure"} {
				want = append(want, p+" hidden")
			}
			want = append(want, "loadavg ['0.00', '0.00', '0.00']", "stat cpus True", "stat counters ['0']",
				"cgroups []", "MemTotal ['131072']", "file-nr []")
			wantOK(t, o, lines(want...))
		}},
})
