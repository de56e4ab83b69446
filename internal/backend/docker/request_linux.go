package docker

import (
	"github.com/vivarium-sandbox/vivarium/internal/agent"
	"github.com/vivarium-sandbox/vivarium/internal/backend/container"
)

// createRequest is POST /containers/create's body: the fields the backend
// sets, named as the Engine API names them.
type createRequest struct {
	Hostname     string
	User         string
	AttachStdin  bool
	AttachStdout bool
	AttachStderr bool
	OpenStdin    bool
	StdinOnce    bool
	Tty          bool
	Env          []string
	Cmd          []string
	Image        string
	WorkingDir   string
	Labels       map[string]string
	// NetworkDisabled, with NetworkMode none: no interface but loopback.
	NetworkDisabled bool
	HostConfig      hostConfig
}

type hostConfig struct {
	NetworkMode      string
	IpcMode          string
	CgroupnsMode     string
	ReadonlyRootfs   bool
	Privileged       bool
	CapDrop          []string
	CapAdd           []string
	SecurityOpt      []string
	Memory           int64
	MemorySwap       int64
	MemorySwappiness *int64 `json:",omitempty"`
	PidsLimit        *int64
	NanoCpus         int64  `json:",omitempty"`
	CgroupParent     string `json:",omitempty"`
	Runtime          string `json:",omitempty"`
	LogConfig        struct{ Type string }
	AutoRemove       bool
	Init             *bool
	Mounts           []mountSpec
	Tmpfs            map[string]string
	ReadonlyPaths    []string
	MaskedPaths      []string `json:",omitempty"` // nil: Docker's
	Ulimits          []ulimit
	Sysctls          map[string]string
}

type mountSpec struct {
	Type        string
	Source      string
	Target      string
	BindOptions struct{ Propagation string }
}

type ulimit struct {
	Name       string
	Soft, Hard int64
}

// Docker's default read-only paths (which ReadonlyPaths replaces), and
// /dev and /sys.
var readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger", "/dev", "/sys"}

// Per-user and IPC limits of every container. The rlimits bound what the
// kernel counts per user against the limit of the process that asks
// (every process of the sandbox has them; the user is the sandbox's
// alone): queued signals, POSIX message-queue bytes, locked memory.
// RLIMIT_CORE is 1, not 0: with a core_pattern that pipes to a handler
// (systemd-coredump, apport), the kernel runs the handler, as host root,
// whatever the limit, except at 1, which it takes for a handler's own
// crash and refuses. The IPC namespace (the container's own) gets few
// System V objects and message queues; what they hold is charged to the
// container's memory cgroup. inotify's limits are per user namespace, and
// Docker's containers are in the host's: each sandbox has the host's
// per-user budget (fs.inotify.max_user_instances, max_user_watches) to
// itself.
const (
	sigPending   = 1024
	msgQueue     = 256 << 10
	memLock      = 64 << 10
	coreLimit    = 1
	ipcObjects   = "32" // kernel.shmmni, kernel.msgmni, fs.mqueue.queues_max
	semaphores   = "250 2000 32 32"
	shmRmidForce = "1" // a segment nobody attaches goes at once
)

// request is the container of one sandbox, whose file system is v.
func (r *Runtime) request(l container.Launch, v *view) *createRequest {
	bind := func(src, dst string) mountSpec {
		m := mountSpec{Type: "bind", Source: src, Target: dst}
		m.BindOptions.Propagation = "rprivate"
		return m
	}
	mounts := []mountSpec{
		// Read-only, nosuid, nodev overlays (see view).
		bind(v.root("etc"), "/etc"),
		bind(v.root(container.RunnerDir), container.RunnerDir),
		bind(v.agent(r.cfg.Exe), agentPath),
		// The disk: a tmpfs of Vivarium's, nosuid and nodev.
		bind(l.Disk.Workspace, "/workspace"),
		bind(l.Disk.Tmp, "/tmp"),
		bind(l.Disk.Shm, "/dev/shm"),
	}
	// Docker binds files of its own there unless something else is.
	for _, f := range []string{"hosts", "hostname", "resolv.conf"} {
		mounts = append(mounts, bind(v.root("etc/"+f), "/etc/"+f))
	}
	for _, d := range hostDirs() {
		mounts = append(mounts, bind(v.host(d), d))
	}
	// The synthesised /proc files (see proc_linux.go).
	for _, p := range v.procFiles {
		mounts = append(mounts, bind(v.root("proc/"+p), "/proc/"+p))
	}
	lim := l.Spec.Limits
	pids := int64(lim.Pids + agentTasks)
	if r.gvisor {
		// gVisor's kernel is host threads, and with the ptrace platform
		// a host process per address space: room for them, as in the
		// gvisor backend; the code's own limit is RLIMIT_NPROC inside.
		pids = int64(512 + 4*lim.Pids)
	}
	no := false
	req := &createRequest{
		Hostname: "sandbox",
		User:     "0:0", // the agent; it becomes the sandbox user
		// Standard input and output are the agent's protocol.
		AttachStdin: true, AttachStdout: true, AttachStderr: true, OpenStdin: true, StdinOnce: true,
		// GOMAXPROCS bounds the agent's threads, which count in the
		// container's pids limit (see agentTasks); the code's environment
		// is the agent's configuration's, not this.
		Env:             []string{"PATH=" + container.RunnerDir + "/bin", "GOMAXPROCS=2"},
		Cmd:             []string{agent.Arg0},
		Image:           r.image,
		WorkingDir:      "/",
		Labels:          map[string]string{labelSandbox: l.ID, labelOwner: r.cfg.Name},
		NetworkDisabled: true,
		HostConfig: hostConfig{
			NetworkMode:    "none",
			IpcMode:        "none", // its own IPC namespace; /dev/shm is the disk's
			CgroupnsMode:   "private",
			ReadonlyRootfs: true,
			CapDrop:        []string{"ALL"},
			// The agent becomes the sandbox user and signals its
			// processes; it empties its bounding set before any starts.
			CapAdd:       []string{"CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_KILL"},
			SecurityOpt:  []string{"no-new-privileges"},
			Memory:       lim.Memory,
			MemorySwap:   lim.Memory, // the same as memory: no swap
			PidsLimit:    &pids,
			CgroupParent: r.cgroupParent,
			Runtime:      r.cfg.Runtime,
			Init:         &no, // the agent is PID 1
			Mounts:       mounts,
			Tmpfs: map[string]string{
				// An empty /sys, as in the native backend; a
				// tmpfs over /sys/fs/cgroup keeps Docker's
				// cgroup mounts out.
				"/sys":           "rw,nosuid,nodev,noexec,size=4k,mode=0555",
				"/sys/fs/cgroup": "ro,nosuid,nodev,noexec,size=4k,mode=0555",
			},
			ReadonlyPaths: readonlyPaths,
			MaskedPaths:   v.maskedPaths(),
			Sysctls: map[string]string{
				// The kernel's default, which Docker opens to every
				// group: no ICMP echo sockets without a privilege.
				"net.ipv4.ping_group_range": "1 0",
				"kernel.shmmni":             ipcObjects,
				"kernel.shm_rmid_forced":    shmRmidForce,
				"kernel.msgmni":             ipcObjects,
				"kernel.sem":                semaphores,
				"fs.mqueue.queues_max":      ipcObjects,
			},
			Ulimits: []ulimit{
				{Name: "nofile", Soft: int64(lim.OpenFiles), Hard: int64(lim.OpenFiles)},
				{Name: "core", Soft: coreLimit, Hard: coreLimit},
				{Name: "sigpending", Soft: sigPending, Hard: sigPending},
				{Name: "msgqueue", Soft: msgQueue, Hard: msgQueue},
				{Name: "memlock", Soft: memLock, Hard: memLock},
			},
		},
	}
	// Output goes nowhere but to Vivarium, through the attach stream.
	req.HostConfig.LogConfig.Type = "none"
	if r.info.CgroupVersion != "2" {
		zero := int64(0)
		req.HostConfig.MemorySwappiness = &zero
	}
	if lim.CPUs > 0 {
		req.HostConfig.NanoCpus = int64(lim.CPUs * 1e9)
	}
	return req
}
