//go:build linux

package hostile

import (
	"strings"
	"testing"
)

// dockerDifferences are the cases whose safe outcome differs in a Docker
// container, and why. The container is made by Docker and runc: its /dev
// and /sys are Docker's (Vivarium empties /sys and makes /dev read-only,
// but cannot choose the devices), Docker's seccomp profile runs under
// Vivarium's filter, and the container's pids limit counts the agent's
// threads. The attack still fails in every case.
var dockerDifferences = map[string]difference{
	"thread_bomb": {why: "the container's pids cgroup counts the agent's own threads (8 to 10) with the code's, " +
		"and Vivarium gives the container 12 more than the sandbox's limit for them (RLIMIT_NPROC, counted per " +
		"host user, would count every sandbox's processes): the code's threads stop within a few of its limit",
		edit: func(code string) string { return strings.Replace(code, "n < 32", "n < 32 + 12", 1) }},
	"seccomp_personality": {why: "Docker's seccomp profile, under Vivarium's filter, refuses libc's personality(" +
		"0xffffffff) query (its rule compares the whole 64-bit argument, which libc passes sign-extended): the " +
		"persona is read from /proc/self/personality instead",
		edit: func(code string) string {
			return strings.Replace(code, "_libc.personality(0xffffffff)", `int(open("/proc/self/personality").read(), 16)`, 1)
		}},
	"seccomp_tiocsti": {why: dockerDev + ": /dev/tty exists, and without a controlling terminal opening it " +
		"says ENXIO", check: want("TIOCSTI fd 0 EPERM", "TIOCSTI fd 1 EPERM", "TIOCSTI fd 2 EPERM",
		"TIOCLINUX EPERM", "TIOCGWINSZ ENOTTY", "open /dev/tty ENXIO")},
	"host_devices": {why: dockerDev + ": besides the native set, mqueue (POSIX message queues of the sandbox's " +
		"own IPC namespace), tty (no controlling terminal: ENXIO) and ptmx with pts (terminals of the container's " +
		"own devpts instance); no host device is reachable, and /dev is read-only",
		check: func(t *testing.T, h *harness, o *outcome) {
			want := []string{"['fd', 'full', 'mqueue', 'null', 'ptmx', 'pts', 'random', 'shm', 'stderr', 'stdin', " +
				"'stdout', 'tty', 'urandom', 'zero']"}
			for _, d := range []string{"mem", "kmem", "port", "kmsg", "sda", "vda", "nvme0n1"} {
				want = append(want, "/dev/"+d+" ENOENT")
			}
			want = append(want, "/dev/ptmx ok", "/dev/tty ENXIO", "/dev/console ENOENT")
			for _, d := range []string{"net/tun", "fuse", "kvm", "loop0", "dri/card0"} {
				want = append(want, "/dev/"+d+" ENOENT")
			}
			want = append(want, "mknod char device EPERM", "mknod block device EPERM", "create in /dev EROFS")
			wantOK(t, o, lines(want...))
		}},
	"change_host_file_metadata": {why: "/usr is a read-only bind of the host's file system, not an overlay: " +
		"truncate(2) checks the file's permission before the mount's read-only flag",
		check: want("chmod su EROFS", "chown passwd EROFS", "utime python EROFS", "truncate os.py EACCES",
			"setxattr EROFS", "chmod workspace root EROFS")},
	"host_directories_not_visible": {why: "Docker always mounts something at /sys: the sandbox's is an empty " +
		"read-only tmpfs, with an empty one at /sys/fs/cgroup that keeps Docker's cgroup mounts out",
		check: want("host dirs ['sys']", "root is /workspace", "var ['tmp']", "home ['user'] /workspace",
			"/sys/fs/cgroup ok", "/sys/kernel ENOENT", "/run/user ENOENT", "/var/lib ENOENT", "/var/log ENOENT",
			"/boot ENOENT")},
}

// dockerDev: why /dev differs.
const dockerDev = "/dev is Docker's (read-only: Vivarium cannot choose its devices through Docker's API)"
