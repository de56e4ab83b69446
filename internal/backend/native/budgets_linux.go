package native

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// KernelLimits bound what one sandbox may hold of the kernel's per-user and
// per-namespace budgets. The host's own limits are per host user, and every
// sandbox is a host user of its own (spawn_linux.go), so a sandbox can only
// ever exhaust its own budgets; these smaller values also bound the kernel
// memory a sandbox pins. They are set in the sandbox's own namespaces
// (/proc/sys/user, the IPC namespace's sysctls), where only its root could
// change them, before any code of the sandbox runs, and as rlimits, which a
// sandbox can lower but never raise.
type KernelLimits struct {
	InotifyInstances int64 // inotify instances per user
	InotifyWatches   int64 // inotify watches per user
	PendingSignals   int64 // queued signals (RLIMIT_SIGPENDING), also what POSIX timers reserve
	MsgQueueBytes    int64 // POSIX message-queue bytes (RLIMIT_MSGQUEUE)
	LockedMemory     int64 // bytes of locked memory (RLIMIT_MEMLOCK)
	ShmSegments      int64 // SysV shared-memory segments (kernel.shmmni)
	MsgQueues        int64 // SysV message queues (kernel.msgmni)
	SemArrays        int64 // SysV semaphore arrays (kernel.sem's SEMMNI)
	MQueues          int64 // POSIX message queues (fs.mqueue.queues_max)
}

// DefaultKernelLimits are generous for notebooks, scripts and the tools a
// shell runs, and far below the host's.
var DefaultKernelLimits = KernelLimits{
	InotifyInstances: 32,
	InotifyWatches:   8192,
	PendingSignals:   1024,
	MsgQueueBytes:    256 << 10,
	LockedMemory:     64 << 10,
	ShmSegments:      64,
	MsgQueues:        32,
	SemArrays:        32,
	MQueues:          16,
}

// kernelLimitNames maps the names users give (--kernel-limit NAME=N) to
// the fields.
var kernelLimitNames = map[string]func(*KernelLimits) *int64{
	"inotify-instances": func(k *KernelLimits) *int64 { return &k.InotifyInstances },
	"inotify-watches":   func(k *KernelLimits) *int64 { return &k.InotifyWatches },
	"pending-signals":   func(k *KernelLimits) *int64 { return &k.PendingSignals },
	"msgqueue-bytes":    func(k *KernelLimits) *int64 { return &k.MsgQueueBytes },
	"locked-memory":     func(k *KernelLimits) *int64 { return &k.LockedMemory },
	"shm-segments":      func(k *KernelLimits) *int64 { return &k.ShmSegments },
	"msg-queues":        func(k *KernelLimits) *int64 { return &k.MsgQueues },
	"sem-arrays":        func(k *KernelLimits) *int64 { return &k.SemArrays },
	"mqueues":           func(k *KernelLimits) *int64 { return &k.MQueues },
}

// KernelLimitNames lists the names Set accepts.
func KernelLimitNames() []string {
	var out []string
	for n := range kernelLimitNames {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Get returns one limit by name (0 for an unknown name).
func (k *KernelLimits) Get(name string) int64 {
	if field := kernelLimitNames[name]; field != nil {
		return *field(k)
	}
	return 0
}

// Set changes one limit by name: "inotify-instances=64".
func (k *KernelLimits) Set(nameValue string) error {
	name, value, ok := strings.Cut(nameValue, "=")
	field := kernelLimitNames[name]
	if !ok || field == nil {
		return fmt.Errorf("kernel limit %q: want NAME=N with NAME one of %s", nameValue, strings.Join(KernelLimitNames(), ", "))
	}
	n, err := strconv.ParseInt(value, 10, 64)
	if err != nil || n < 0 || n > 1<<31-1 {
		return fmt.Errorf("kernel limit %s: %q is not a count between 0 and 2147483647", name, value)
	}
	*field(k) = n
	return nil
}

// withDefaults fills the zero fields; a limit cannot be "none".
func (k KernelLimits) withDefaults() KernelLimits {
	for _, field := range kernelLimitNames {
		if *field(&k) == 0 {
			*field(&k) = *field(&DefaultKernelLimits)
		}
	}
	return k
}

// sysctl is one value init writes under /proc/sys in the sandbox's own
// namespaces.
type sysctl struct {
	Path  string `json:"path"` // relative to /proc/sys
	Value string `json:"value"`
}

// namespaceSysctls are the sysctls of the sandbox's user and IPC
// namespaces. The user namespace's max_*_namespaces are 0: seccomp already
// refuses creating namespaces, and this says it a second time in the
// kernel's own terms.
func (k KernelLimits) namespaceSysctls(memory int64) []sysctl {
	n := func(v int64) string { return strconv.FormatInt(v, 10) }
	out := []sysctl{
		{"user/max_inotify_instances", n(k.InotifyInstances)},
		{"user/max_inotify_watches", n(k.InotifyWatches)},
		{"kernel/shmmni", n(k.ShmSegments)},
		{"kernel/msgmni", n(k.MsgQueues)},
		// SEMMSL SEMMNS SEMOPM SEMMNI: 32 semaphores a set, 32 sets.
		{"kernel/sem", fmt.Sprintf("32 %d 32 %d", 32*k.SemArrays, k.SemArrays)},
		{"fs/mqueue/queues_max", n(k.MQueues)},
	}
	if memory > 0 {
		// Shared memory is charged to the memory cgroup anyway; no segment
		// or total larger than the sandbox's memory is of any use.
		out = append(out, sysctl{"kernel/shmmax", n(memory)}, sysctl{"kernel/shmall", n((memory + 4095) / 4096)})
	}
	for _, ns := range []string{"user", "pid", "net", "mnt", "ipc", "uts", "cgroup", "time"} {
		out = append(out, sysctl{"user/max_" + ns + "_namespaces", "0"})
	}
	return out
}

// rlimits are the per-user budgets a sandbox's processes get as rlimits.
func (k KernelLimits) rlimits() []rlimit {
	u := func(v int64) uint64 { return uint64(v) }
	return []rlimit{
		{"sigpending", unix.RLIMIT_SIGPENDING, u(k.PendingSignals), u(k.PendingSignals)},
		{"msgqueue", unix.RLIMIT_MSGQUEUE, u(k.MsgQueueBytes), u(k.MsgQueueBytes)},
		{"memlock", unix.RLIMIT_MEMLOCK, u(k.LockedMemory), u(k.LockedMemory)},
	}
}

// writeSysctls writes the sandbox's namespace sysctls under proc, a proc
// just mounted by init, which is root of the sandbox's user namespace. A
// value the kernel does not know (an older kernel without a limit, such as
// max_time_namespaces) is skipped; one it refuses fails the sandbox.
func writeSysctls(proc string, values []sysctl) error {
	for _, s := range values {
		p := filepath.Join(proc, "sys", s.Path)
		f, err := os.OpenFile(p, os.O_WRONLY|unix.O_NOFOLLOW, 0)
		if os.IsNotExist(err) {
			continue
		}
		if err == nil {
			_, err = f.WriteString(s.Value)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			return step("sysctl "+strings.ReplaceAll(s.Path, "/", "."), err)
		}
	}
	return nil
}

// InitReserve is how many tasks a sandbox's cgroup may hold beyond its
// pids limit while it starts or is restored, for Vivarium's init: a Go
// program, whose runtime threads (7 or 8 measured at rest with one P,
// and spareThreads' 8 more; more once several of its goroutines have
// been in system calls at once, which a loaded host makes likelier)
// would otherwise be taken from what the sandbox's code was promised.
// Once init runs, fitPids narrows the room to the threads init has.
const InitReserve = 32

// groupLimits is what a native sandbox's cgroup limits when it is made:
// the spec's, with room for init (InitReserve).
func groupLimits(spec sandbox.Spec) cgroups.Limits {
	l := cgroups.Of(spec)
	if l.Pids > 0 {
		l.Pids += InitReserve
	}
	return l
}

// threadsOf is how many threads process pid has, from one stat of
// /proc/PID/task, whose link count the kernel gives as two plus the
// threads (proc_task_getattr). fitPids asks before every execution, and
// what else tells the count costs more: listing the directory makes an
// entry for each thread, and reading /proc/PID/stat formats its fifty
// fields (7% of the server's CPU in a warm execution, either of them).
func threadsOf(pid int) (int, error) {
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/task", pid), &st); err != nil {
		return 0, err
	}
	return int(st.Nlink) - 2, nil
}

// fitPids sets the sandbox's pids limit to the spec's plus the threads
// init has now, so that the sandbox's code gets exactly its limit (the
// runner among it). Seen on a loaded CI machine before it did: 20 threads
// and a runner under a limit of 32 left no room for one more process.
// Init's runtime does not give threads back, so the limit only follows
// it up; it is checked before each execution and after a restore.
func (s *Sandbox) fitPids() {
	if s.cg == nil || s.spec.Limits.Pids <= 0 || s.init == nil {
		return
	}
	ps, ok := s.cg.(cgroups.PidsSetter)
	if !ok {
		return
	}
	threads, err := threadsOf(s.init.pid)
	if err != nil || threads <= 0 {
		return
	}
	n := int64(s.spec.Limits.Pids + threads)
	if s.pidsMax.Load() == n {
		return
	}
	if err := ps.SetPidsMax(int(n)); err == nil {
		s.pidsMax.Store(n)
	}
}
