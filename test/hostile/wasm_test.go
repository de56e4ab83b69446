//go:build linux

package hostile

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// noKernelBudgets: a wasm sandbox makes no system call of the host's that
// a budget counts (no inotify, signals, queues, pipes, sockets, shared
// memory or processes: no ctypes to ask for them).
const noKernelBudgets = "no kernel budgets to take: no ctypes, no processes, no host system calls"

// wasmDifferences are the cases whose safe outcome on the wasm backend is
// not the native one, and why. A wasm sandbox is one CPython interpreter
// inside WebAssembly: there is no kernel behind it to attack, no /proc, no
// processes, threads or signals, no sockets, no system calls beyond WASI,
// no ctypes; its file system is what the host builds (the standard library
// and the runner read-only, /dev with null, zero and the runner's channel,
// /workspace in memory). Most attacks therefore stop at their first step,
// and the case asserts exactly that step's error (refused). Where the
// attack still has a target (files, the disk, descriptors, the protocol),
// the case asserts the wasm outcome in full.
// wasmSlow: CPython in WebAssembly runs CPU-bound Python about 20 times
// slower than python3; a case that builds tens of megabytes of results
// takes it 5 to 20 s alone and more on a loaded machine. Its wall clock
// is the backend's, not the case's point.
const wasmSlow = "the wasm interpreter builds the case's tens of megabytes of results about 20 times slower than python3: " +
	"a longer wall clock, the same check"

// wasmWallClock gives a case the wall clock of the wasm backend's speed.
func wasmWallClock(t *testing.T, h *harness, j *job) { j.Spec.Limits.Timeout = 4 * time.Minute }

var wasmDifferences = withReadOnlyRoot(map[string]difference{
	"huge_result":                    {why: wasmSlow, prepare: wasmWallClock},
	"huge_frame_data":                {why: wasmSlow, prepare: wasmWallClock},
	"result_encoding_outgrows_frame": {why: wasmSlow, prepare: wasmWallClock},
	"results_over_the_total_cap":     {why: wasmSlow, prepare: wasmWallClock},
	"volume_escape":                  {why: noVolumes},
	"volume_pass_descriptors":        {why: noVolumes},
	// Kernel budgets (cases_budgets_test.go): nothing to take.
	"take_all_inotify_instances":      {why: noKernelBudgets},
	"take_all_inotify_watches":        {why: noKernelBudgets},
	"queue_signals_until_refused":     {why: noKernelBudgets},
	"fill_posix_message_queues":       {why: noKernelBudgets},
	"reserve_all_pipe_buffers":        {why: noKernelBudgets},
	"park_descriptors_in_flight":      {why: noKernelBudgets},
	"lock_shared_memory":              {why: noKernelBudgets},
	"fill_socket_buffers":             {why: noKernelBudgets},
	"take_every_process_slot":         {why: noKernelBudgets},
	"crash_runs_no_host_core_handler": {why: noProcesses + ": nothing can crash but the interpreter, inside WebAssembly"},
	"lock_own_executable":             {why: "an interpreter inside WebAssembly: no /proc, no executable file to open"},
	// Processes and signals.
	"processes_outlive_the_run":    {why: noProcesses, check: refused("OSError", "cannot start processes")},
	"daemon_writes_stdout_forever": {why: noProcesses, check: refused("AttributeError", "'fork'")},
	"child_holds_stdout_open":      {why: noProcesses, check: refused("OSError", "cannot start processes")},
	"child_sleeps_past_timeout":    {why: noProcesses, check: refused("OSError", "cannot start processes")},
	"cpu_time_across_processes":    {why: noProcesses, check: refused("AttributeError", "'fork'")},
	"output_flood_from_processes":  {why: noProcesses, check: refused("AttributeError", "'fork'")},
	"fork_bomb":                    {why: noProcesses, check: refused("AttributeError", "'fork'")},
	"memory_bomb_in_children":      {why: noProcesses, check: refused("AttributeError", "'fork'")},
	"shell_fork_bomb":              {why: noProcesses + "; and no /tmp", check: refused("FileNotFoundError", "/tmp/bomb.err")},
	"signal_namespace_init":        {why: noProcesses, check: refused("AttributeError", "'kill'")},
	"sigstop_self":                 {why: noProcesses, check: refused("AttributeError", "'kill'")},
	"ptrace":                       {why: noProcesses, check: refused("OSError", "cannot start processes")},
	"new_user_namespace":           {why: noProcesses, check: refused("OSError", "cannot start processes")},

	// Threads.
	"daemon_thread_keeps_printing": {why: noThreads, check: refused("RuntimeError", "no threads")},
	"thread_keeps_running":         {why: noThreads, check: refused("RuntimeError", "no threads")},
	"sys_exit_in_thread":           {why: noThreads, check: refused("RuntimeError", "no threads")},
	"os_exit_in_thread":            {why: noThreads, check: refused("RuntimeError", "no threads")},

	// The network.
	"reach_host_loopback_services": {why: noNetwork, check: refused("OSError", "no network")},
	"reach_host_addresses":         {why: noNetwork, check: refused("OSError", "no network")},
	"cloud_metadata":               {why: noNetwork, check: refused("OSError", "no network")},
	"reach_internet":               {why: noNetwork, check: refused("OSError", "no network")},
	"sandbox_listener_not_reachable_from_host": {why: noNetwork,
		// Without the host's dialler, which waits for a listener.
		prepare: func(t *testing.T, h *harness, j *job) { j.vars["PORT"] = fmt.Sprint(freePort(t)) },
		check:   refused("OSError", "no network")},
	"reach_host_unix_sockets":     {why: noNetwork, check: refused("AttributeError", "AF_UNIX")},
	"raw_and_packet_sockets":      {why: noNetwork, check: refused("AttributeError", "SOCK_RAW")},
	"dns":                         {why: noNetwork, check: refused("AttributeError", "gethostbyname")},
	"hostname_and_kernel_log":     {why: noNetwork + "; no hostname, no kernel log", check: refused("AttributeError", "gethostname")},
	"netlink_reconfigure_network": {why: noNetwork + "; no fcntl", check: refused("ModuleNotFoundError", "fcntl")},

	// /proc, users, privileges.
	"capabilities_and_no_new_privs": {why: noProc, check: refused("FileNotFoundError", "/proc/self/status")},
	"cgroup_escape":                 {why: noProc, check: refused("FileNotFoundError", "/proc/self/cgroup")},
	"enter_other_namespaces":        {why: noProc, check: refused("FileNotFoundError", "/proc/self/ns")},
	"mount_and_chroot":              {why: noProc, check: refused("FileNotFoundError", "/proc/self/mountinfo")},
	"proc_self_root_escape":         {why: noProc, check: refused("FileNotFoundError", "/proc/self/root")},
	"host_processes_not_visible":    {why: noProc, check: refused("FileNotFoundError", "/proc")},
	"raise_oom_protection":          {why: noProc, check: refused("FileNotFoundError", "/proc/self/oom_score_adj")},
	"proc_1_tricks":                 {why: noProc, check: allLinesEnd(" ENOENT", 17)},
	"proc_reveals_host":             {why: noProc + ": nothing of the host to read"},
	"watch_host_file_activity": {why: "WASI has no inotify, and the sandbox's tree is the interpreter's own files: " +
		"nothing it opens is the host's"},
	"lock_host_files": {why: "WASI has no file locks (no fcntl module), and the sandbox's tree is the interpreter's " +
		"own files: nothing it could lock is the host's"},
	"write_proc_sys": {why: noProc, check: func(t *testing.T, h *harness, o *outcome) {
		var want []string
		for _, p := range []string{"kernel/core_pattern", "kernel/modprobe", "kernel/hostname", "vm/drop_caches",
			"vm/overcommit_memory", "kernel/sysrq", "net/ipv4/ip_forward", "fs/protected_symlinks"} {
			want = append(want, p+" ENOENT")
		}
		wantOK(t, o, lines(append(want, "sysrq-trigger refused True")...))
	}},
	"read_host_environment": {why: noProc + "; the environment is only what the sandbox was given",
		check: func(t *testing.T, h *harness, o *outcome) {
			refused("FileNotFoundError", "/proc/self/environ")(t, h, o)
			if o.Stdout != lines("canary var None", "home /workspace user sandbox") {
				t.Fatalf("stdout %q", o.Stdout)
			}
		}},
	"host_users_and_groups": {why: noUsers, check: refused("ModuleNotFoundError", "grp")},
	"become_root":           {why: noUsers, check: refused("AttributeError", "getuid")},
	"setuid_binaries_and_sudo": {why: noUsers + "; no programs to run, no statvfs",
		check: refused("AttributeError", "statvfs")},
	"raise_rlimits": {why: "WASI has no resource limits to raise: the host enforces them from outside",
		check: refused("ModuleNotFoundError", "resource")},
	"fd_exhaustion": {why: "no resource module, no pipes, no sockets: descriptors are opened through the file system, " +
		"see low_open_files_limit", check: refused("ModuleNotFoundError", "resource")},

	// System calls: WASI's only, and no ctypes to make another.
	"seccomp_bpf_perf_userfaultfd": {why: noSyscalls, check: allLinesEnd(" no syscalls", 5)},
	"seccomp_keyrings":             {why: noSyscalls, check: allLinesEnd(" no syscalls", 3)},
	"seccomp_x32_entry_points":     {why: noSyscalls, check: allLinesEnd(" no syscalls", 2)},
	"seccomp_io_uring":             {why: noSyscalls + " (its probe needs ctypes to build its arguments)"},
	"seccomp_personality":          {why: noSyscalls + " (its probe needs ctypes to build its arguments)"},
	"seccomp_tiocsti":              {why: noSyscalls + " (its probe needs ctypes to build its arguments)"},
	"seccomp_machine_state":        {why: noSyscalls + " (its probe needs ctypes to build its arguments)"},
	"seccomp_file_handles":         {why: noSyscalls + " (its probe needs ctypes to build its arguments)"},
	"seccomp_kernel_modules":       {why: noSyscalls + " (and no module file to load)"},
	"seccomp_socket_families":      {why: noSyscalls + " (its probe needs ctypes to build its arguments)"},
	"seccomp_refused_calls":        {why: noSyscalls + " (its probe needs ctypes to build its arguments)"},
	"seccomp_aio_pool":             {why: noSyscalls + " (its probe needs ctypes to build its arguments)"},
	"seccomp_page_cache":           {why: noSyscalls + " (its probe needs ctypes to build its arguments); no /usr"},
	"seccomp_core_limit":           {why: noSyscalls + " (its probe needs ctypes to build its arguments)"},
	"seccomp_prctl_options":        {why: noSyscalls + " (its probe needs ctypes to build its arguments)"},
	"seccomp_ioctl_requests":       {why: noSyscalls + " (its probe needs ctypes to build its arguments)"},
	"seccomp_ksm_and_sync":         {why: noSyscalls + " (its probe needs ctypes to build its arguments)"},
	"sysv_shared_memory_bomb":      {why: noSyscalls, check: refused("ModuleNotFoundError", "_ctypes")},

	// The file system: only what the host builds is there.
	"write_read_only_root": {why: "only /workspace is writable; what does not exist in the sandbox's tree " +
		"(/etc, /var, /usr/bin) cannot be created either", check: func(t *testing.T, h *harness, o *outcome) {
		wantOK(t, o, lines("append /etc/passwd ENOENT", "create /etc/cron.d/evil ENOENT",
			"create /usr/bin/evil ENOENT", "create /usr/lib/python3/dist-packages/evil.pth ENOENT",
			"overwrite the runner EROFS", "overwrite python ENOENT", "mkdir /evil EROFS",
			"unlink /etc/hosts ENOENT", "rename /etc/passwd ENOENT", "symlink in / EROFS",
			"write /var/evil ENOENT"))
		for _, p := range []string{"/usr/bin/evil", "/usr/lib/python3/dist-packages/evil.pth", "/evil", "/var/evil"} {
			hostFileAbsent(t, p)
		}
	}},
	"change_host_file_metadata": {why: "WASI has no chmod (os.chmod does nothing) and no chown; the host's files " +
		"are not in the sandbox's tree", check: func(t *testing.T, h *harness, o *outcome) {
		refused("AttributeError", "chown")(t, h, o)
		if o.Stdout != lines("chmod su ok") {
			t.Fatalf("stdout %q", o.Stdout)
		}
	}},
	"link_to_host_files": {why: "links across mounts are refused (EROFS), and no symbolic link can be made",
		check: func(t *testing.T, h *harness, o *outcome) {
			refused("PermissionError", "Operation not permitted")(t, h, o)
			if o.Stdout != lines("hard link python EROFS", "hard link passwd into tmp ENOENT") {
				t.Fatalf("stdout %q", o.Stdout)
			}
		}},
	"host_ptys_bounded": {why: "WASI has no terminals", check: refused("AttributeError", "openpty")},
	"host_devices": {why: "/dev holds null, zero and the runner's channel; WASI has no mknod",
		check: func(t *testing.T, h *harness, o *outcome) {
			refused("AttributeError", "mknod")(t, h, o)
			want := []string{"['null', 'vivarium', 'zero']"}
			for _, d := range []string{"mem", "kmem", "port", "kmsg", "sda", "vda", "nvme0n1", "ptmx", "tty",
				"console", "net/tun", "fuse", "kvm", "loop0", "dri/card0"} {
				want = append(want, "/dev/"+d+" ENOENT")
			}
			if o.Stdout != lines(want...) {
				t.Fatalf("stdout %q", o.Stdout)
			}
		}},
	"host_directories_not_visible": {why: "the sandbox's tree has no /var, /home, /boot ...",
		check: func(t *testing.T, h *harness, o *outcome) {
			refused("FileNotFoundError", "/var")(t, h, o)
			if o.Stdout != lines("host dirs []", "run None", "root is /root") {
				t.Fatalf("stdout %q", o.Stdout)
			}
		}},
	"symlinks_in_out":    {why: noSymlinks, check: refused("PermissionError", "Operation not permitted")},
	"fifo_socket_in_out": {why: "WASI has no FIFOs or Unix sockets", check: refused("AttributeError", "mkfifo")},
	"odd_names_in_out": {why: "WASI paths are UTF-8: a name of invalid UTF-8 is refused (EPERM), so it is left out",
		edit: func(code string) string {
			return strings.Replace(code, `os.fsdecode(b"\xff\xfe"), `, "", 1)
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("9"))
			tree, err := testutil.Tree(o.outDir)
			if err != nil {
				t.Fatal(err)
			}
			files := 0
			for p, e := range tree {
				switch e.Type {
				case "file":
					files++
				case "dir":
				default:
					t.Errorf("%s in out is a %s", p, e.Type)
				}
			}
			if files != 9 {
				t.Fatalf("%d files copied out, want 9: %v", files, tree)
			}
		}},
	"persistence_into_a_later_run": {why: "no /tmp, /dev/shm, shared memory or processes to persist in: " +
		"only the workspace, which is the sandbox's own",
		code: `
import os, sys
m = os.environ["MARKER"]
for p in ("/workspace/" + m, "/workspace/.bashrc", "/workspace/sitecustomize.py", "/workspace/json.py"):
    with open(p, "w") as f:
        f.write("print('pwned')\n")
site = "/workspace/.local/lib/python%d.%d/site-packages" % sys.version_info[:2]
os.makedirs(site)
with open(site + "/usercustomize.py", "w") as f:
    f.write("print('pwned')\n")
print("planted")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("planted"))
			later := &job{OneShot: sandbox.OneShot{Spec: sandbox.Spec{Limits: baseLimits}, Request: sandbox.ExecRequest{Code: `
import json, os
print("workspace", os.listdir("/workspace"))
print("json is the stdlib's", json.__file__.startswith("/usr/local/lib/python3"))
`}}, vars: o.vars}
			o2 := h.run(t, later)
			wantStarted(t, o2)
			wantOK(t, o2, lines("workspace []", "json is the stdlib's True"))
		}},
	"poison_preloaded_modules": {why: "no /tmp to plant a module in",
		edit: func(code string) string {
			return strings.Replace(code, `open("/tmp/poison.py", "w").write("print('pwned')")`, "", 1)
		}},
	"neighbour_sandbox": {why: "no /tmp, /dev/shm, sockets or processes: a neighbour can only leave files " +
		"and state in its own interpreter and workspace",
		prepare: func(t *testing.T, h *harness, j *job) {
			sb, err := h.be.B.Create(context.Background(), sandbox.Spec{Limits: baseLimits})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sb.Close() })
			m := marker()
			res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: fmt.Sprintf(`
import json, builtins
m = %q
open("/workspace/" + m, "w").write("x")
json.marker = m
builtins.marker = m
print("planted")
`, m)}, nil)
			if err != nil || res.Status != sandbox.StatusOK || res.Stdout != "planted\n" {
				t.Fatalf("the neighbour did not plant its traps: %v %+v", err, res)
			}
			j.vars["MARKER"] = m
		},
		code: `
import builtins, json, os
m = os.environ["MARKER"]
print("workspace marker", os.path.exists("/workspace/" + m), "json", hasattr(json, "marker"),
      "builtins", hasattr(builtins, "marker"))
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("workspace marker False json False builtins False"))
		}},
	"deep_and_unreadable_tree_in_out": {why: "WASI has no permissions: os.chmod does nothing, so nothing is unreadable",
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("made"))
			tree, err := testutil.Tree(o.outDir)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"ok.txt", "noperm.txt", filepath.Join("locked", "inner", "f.txt")} {
				if tree[want].Type != "file" {
					t.Errorf("out lacks %s: %v", want, tree)
				}
			}
		}},

	// The disk: WASI preview 1, as wazero implements it, has no ENOSPC,
	// EFBIG or EMFILE; a full disk or descriptor table is EIO, and the
	// sandbox says why on stderr.
	"disk_fill": {why: noENOSPC, check: func(t *testing.T, h *harness, o *outcome) {
		wantOK(t, o, lines("stopped False"))
		wantFullNote(t, o, "the workspace is full")
		wantFilesWithin(t, o)
	}},
	"disk_fill_tmp_and_shm": {why: noENOSPC + "; no /tmp or /dev/shm", check: func(t *testing.T, h *harness, o *outcome) {
		wantOK(t, o, lines("/tmp ENOENT", "/dev/shm ENOENT", "/workspace EIO", "total within the limit True"))
		wantFullNote(t, o, "the workspace is full")
	}},
	"inode_fill": {why: noENOSPC, check: func(t *testing.T, h *harness, o *outcome) {
		wantOK(t, o, lines("stopped EIO bounded True"))
		wantFullNote(t, o, "the workspace is full")
	}},
	"huge_sparse_file": {why: noENOSPC + "; a file costs its apparent size, holes included",
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("truncate 1 TiB EIO", "write at 1 GiB EIO", "fallocate 1 GiB EIO", "fallocate 15 MiB twice EIO"))
		}},
	"sparse_file_amplification": {why: "a file costs its apparent size, holes included: the second 15 MiB sparse " +
		"file does not fit the 16 MiB disk", check: func(t *testing.T, h *harness, o *outcome) {
		refused("OSError", "I/O error")(t, h, o)
		wantFullNote(t, o, "the workspace is full")
	}},
	"low_open_files_limit": {why: noENOSPC, check: func(t *testing.T, h *harness, o *outcome) {
		wantOK(t, o, lines("EIO under the limit True"))
		wantFullNote(t, o, "too many open files")
	}},

	// The protocol: the runner's channel is /dev/vivarium, open at a low
	// descriptor, found without /proc.
	"forged_done_on_event_pipe": {why: noProcFD, edit: withoutProcFD},
	"forged_done_then_hang":     {why: noProcFD, edit: withoutProcFD},
	"garbage_on_event_pipe":     {why: noProcFD, edit: withoutProcFD},
	"many_empty_results":        {why: noProcFD, edit: withoutProcFD},
	"write_to_inherited_descriptors": {why: noProcFD + "; fd 3 is the root directory and fd 4 the runner's channel, " +
		"which the code can write to as native code can write to the runner's pipe: it breaks only its own results",
		edit: func(code string) string {
			return strings.Replace(code, `print("open", sorted(int(f) for f in os.listdir("/proc/self/fd") if int(f) > 2 and int(f) < 10))`, "", 1)
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("fd 3 EISDIR", "fd 4 ok", "fd 5 EBADF", "fd 6 EBADF", "fd 7 EBADF", "fd 8 EBADF", "fd 9 EBADF"))
			if o.Error == nil || o.Error.Name != "ProtocolError" {
				t.Fatalf("want a ProtocolError; %s", describe(o))
			}
		}},
})

// Why cases differ on the wasm backend.
const (
	noProcesses = "a wasm sandbox is one interpreter: WASI has no fork, exec, subprocess or signals"
	noThreads   = "WebAssembly without threads: a thread cannot start"
	noNetwork   = "WASI gives the guest no sockets: there is no network to reach"
	noProc      = "there is no /proc: the sandbox's tree is only what the host builds"
	noUsers     = "WASI has no users, groups or privileges"
	noSyscalls  = "no system calls but WASI's, and no ctypes to make one: there is no filter to test"
	noSymlinks  = "the workspace refuses symbolic links (EPERM): no path can lead elsewhere"
	noENOSPC    = "WASI preview 1 in wazero has no ENOSPC, EFBIG or EMFILE: the limit holds with EIO, " +
		"and the sandbox says why on stderr"
	noProcFD = "no /proc/self/fd: the runner's channel is found by trying descriptors"
)

// refused: the attack stopped at its first step, for want of what it
// needed, with this exception.
func refused(name, contains string) func(t *testing.T, h *harness, o *outcome) {
	return func(t *testing.T, h *harness, o *outcome) {
		t.Helper()
		wantStatus(t, o, sandbox.StatusError, 1)
		if o.Error == nil || o.Error.Name != name || !strings.Contains(o.Error.Value, contains) {
			t.Fatalf("want %s mentioning %q; got %s", name, contains, describe(o))
		}
	}
}

// allLinesEnd: the code ran to its end and printed n lines, each ending so.
func allLinesEnd(suffix string, n int) func(t *testing.T, h *harness, o *outcome) {
	return func(t *testing.T, h *harness, o *outcome) {
		t.Helper()
		wantStatus(t, o, sandbox.StatusOK, 0)
		got := strings.Split(strings.TrimSuffix(o.Stdout, "\n"), "\n")
		if len(got) != n {
			t.Fatalf("%d lines, want %d; %s", len(got), n, describe(o))
		}
		for _, l := range got {
			if !strings.HasSuffix(l, suffix) {
				t.Fatalf("line %q does not end with %q; %s", l, suffix, describe(o))
			}
		}
	}
}

// wantFullNote: the sandbox told the code, on stderr, which limit it hit.
func wantFullNote(t *testing.T, o *outcome, note string) {
	t.Helper()
	if !strings.Contains(o.Stderr, "vivarium: "+note) {
		t.Fatalf("stderr lacks %q: %q", note, o.Stderr)
	}
}

// withoutProcFD makes forgeFrames look for the runner's channel among the
// low descriptors instead of listing /proc/self/fd, and take any writable
// one that is not a directory (WASI has no FIFO file type, nor inode
// numbers that tell a pipe's ends).
func withoutProcFD(code string) string {
	code = strings.Replace(code, `sorted(int(f) for f in os.listdir("/proc/self/fd"))`, "range(3, 64)", 1)
	code = strings.Replace(code, ` and not _both_ends_here(fd, FDS)`, "", 1)
	return strings.Replace(code, `stat.S_ISFIFO(os.fstat(fd).st_mode)`, `not stat.S_ISDIR(os.fstat(fd).st_mode)`, 1)
}
