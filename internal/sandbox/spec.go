package sandbox

import (
	"fmt"
	"strings"
	"time"
)

// Limits bound what a sandbox may use. Zero means the default, except for
// CPUTime, where zero means no limit beyond the wall clock.
type Limits struct {
	Timeout   time.Duration // wall clock per execution
	CPUTime   time.Duration // CPU time per execution, all processes together
	Memory    int64         // bytes of memory, swap off
	Pids      int           // processes and threads at once
	Disk      int64         // bytes of /workspace, /tmp and /dev/shm together
	MaxOutput int64         // bytes kept per stream (stdout, stderr); the rest is dropped
	OpenFiles int           // open file descriptors per process
	// CPUs caps CPU bandwidth in cores (0.5: half a core); zero means no
	// cap beyond the sandbox's fair share.
	CPUs float64
	// Disk I/O rates on each block device behind the host's / and /usr,
	// which a sandbox reads the host's /usr from (cgroup blkio throttle or
	// io.max): bytes and operations a second, read and write. Zero means
	// the default; NoIOLimit means none, for a host without the cgroup
	// controller that enforces them.
	IOReadBPS, IOWriteBPS   int64
	IOReadIOPS, IOWriteIOPS int64
}

// NoIOLimit, as an I/O rate of Limits, means no limit.
const NoIOLimit = -1

// Defaults for Limits.
const (
	DefaultTimeout   = 30 * time.Second
	DefaultMemory    = 512 << 20
	DefaultPids      = 64
	DefaultDisk      = 256 << 20
	DefaultMaxOutput = 1 << 20
	DefaultOpenFiles = 1024
	// Disk reads. A cold `import pandas` reads 87 MB in 685 requests, in
	// 350 ms on a disk that gives one reader 800 MiB/s and 60,000 random
	// reads a second: at 192 MiB/s it takes 410 ms (+17%; 128 MiB/s:
	// +80%, 256 MiB/s: +3%), and one sandbox keeps to under a quarter of
	// the disk's bandwidth and a fifteenth of its reads a second.
	DefaultIOReadBPS  = 192 << 20
	DefaultIOReadIOPS = 4000
	// Writes reach a disk only through a backend whose writable layer is
	// on one (docker's), never from a native sandbox (tmpfs), and cost a
	// device more than reads.
	DefaultIOWriteBPS  = 64 << 20
	DefaultIOWriteIOPS = 1000
)

// WithDefaults returns l with zero fields set to their defaults.
func (l Limits) WithDefaults() Limits {
	if l.Timeout == 0 {
		l.Timeout = DefaultTimeout
	}
	if l.Memory == 0 {
		l.Memory = DefaultMemory
	}
	if l.Pids == 0 {
		l.Pids = DefaultPids
	}
	if l.Disk == 0 {
		l.Disk = DefaultDisk
	}
	if l.MaxOutput == 0 {
		l.MaxOutput = DefaultMaxOutput
	}
	if l.OpenFiles == 0 {
		l.OpenFiles = DefaultOpenFiles
	}
	def := func(v *int64, d int64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&l.IOReadBPS, DefaultIOReadBPS)
	def(&l.IOReadIOPS, DefaultIOReadIOPS)
	def(&l.IOWriteBPS, DefaultIOWriteBPS)
	def(&l.IOWriteIOPS, DefaultIOWriteIOPS)
	return l
}

// WithoutIOLimit returns l with no disk I/O limit: what an operator's
// --insecure-no-io-limit asks for.
func (l Limits) WithoutIOLimit() Limits {
	l.IOReadBPS, l.IOWriteBPS, l.IOReadIOPS, l.IOWriteIOPS = NoIOLimit, NoIOLimit, NoIOLimit, NoIOLimit
	return l
}

// Validate checks that limits are usable: each check names the limit and
// the accepted range, in words a user of the CLI or API can act on.
func (l Limits) Validate() error {
	checks := []struct {
		bad bool
		msg string
	}{
		{l.Timeout < 0 || l.Timeout > 24*time.Hour, "timeout must be between 0 and 24h"},
		{l.CPUTime < 0 || l.CPUTime > 24*time.Hour, "cpu time must be between 0 and 24h"},
		{l.Memory != 0 && (l.Memory < 16<<20 || l.Memory > 1<<40), "memory must be between 16MiB and 1TiB"},
		{l.Pids < 0 || l.Pids == 1 || l.Pids > 1<<16, "pids must be between 2 and 65536"},
		{l.Disk != 0 && (l.Disk < 1<<20 || l.Disk > 1<<40), "disk must be between 1MiB and 1TiB"},
		{l.MaxOutput < 0 || l.MaxOutput > 1<<30, "max output must be between 0 and 1GiB"},
		{l.OpenFiles < 0 || l.OpenFiles > 1<<20, "open files must be between 64 and 1048576"},
		{l.OpenFiles != 0 && l.OpenFiles < 64, "open files must be between 64 and 1048576"},
		{l.CPUs < 0 || l.CPUs > 1024 || (l.CPUs > 0 && l.CPUs < 0.01), "cpus must be between 0.01 and 1024"},
		{badRate(l.IOReadBPS, 1<<20, 1<<40) || badRate(l.IOWriteBPS, 1<<20, 1<<40),
			"disk I/O rates must be between 1MiB and 1TiB a second (-1: none, where the server allows it)"},
		{badRate(l.IOReadIOPS, 10, 1<<30) || badRate(l.IOWriteIOPS, 10, 1<<30),
			"disk I/O operations must be between 10 and 1073741824 a second (-1: none, where the server allows it)"},
	}
	for _, c := range checks {
		if c.bad {
			return fmt.Errorf("%w: %s", ErrInvalidSpec, c.msg)
		}
	}
	return nil
}

// badRate: an I/O rate is zero (the default), NoIOLimit, or within
// [lo, hi].
func badRate(v, lo, hi int64) bool {
	return v != 0 && v != NoIOLimit && (v < lo || v > hi)
}

// Spec describes a sandbox to create.
type Spec struct {
	Limits Limits
	// Env is the sandbox's environment on top of a minimal base (PATH, HOME,
	// LANG). Nothing of the host's environment is passed in.
	Env map[string]string
	// Python is the interpreter path inside the sandbox.
	Python string
	// OneShot sandboxes run a single execution, and its exit status is the
	// program's own: sys.exit(3) ends the sandbox with 3.
	OneShot bool
	// Backend names the backend that makes the sandbox, where several are
	// offered (see Mux); empty: the default one. Backends themselves
	// ignore it.
	Backend string `json:",omitempty"`
	// Egress, when set, is the sandbox's proxy to the network (see
	// Egress); nil: no network at all. Backends that cannot give one
	// refuse the spec (CheckEgress). Never part of a pool's key: a
	// sandbox with an Egress is made for its caller.
	Egress Egress `json:"-"`
	// Tenant, when not empty, is who the sandbox works for (a server's API
	// key id, never the key): backends that can group sandboxes put it in
	// its tenant's group, so that tenants share CPU and disk equally
	// however many sandboxes each runs. It goes into paths: ValidTenant.
	// Part of a pool's key, so that a pooled sandbox is made in its
	// tenant's group from the start.
	Tenant string `json:",omitempty"`
	// Home is the sandbox user's home and the directory its code starts
	// in: HomeWorkspace (the default, "" too), or HomeUser, the layout of
	// E2B's sandboxes, where the user is named "user". Both paths show the
	// one workspace. Part of a pool's key.
	Home string `json:",omitempty"`
	// Volumes are persistent volumes to mount (see VolumeMount). Backends
	// that cannot refuse the spec (CheckVolumes). Never part of a pool's
	// key: a sandbox with volumes is made for its caller.
	Volumes []VolumeMount `json:"-"`
	// Pausable asks for a sandbox that can be paused (Pauser): a backend
	// whose faster sandboxes cannot be (native's, forked from a zygote)
	// makes this one the way that can. Part of a pool's key.
	Pausable bool `json:",omitempty"`
	// Root, when set, is a template's file system, the sandbox's root in
	// place of the host's /usr (see Root); its Python is the template's.
	// Backends that cannot refuse the spec (CheckRoot). Part of a pool's
	// key.
	Root *Root `json:",omitempty"`
	// Template names the template a service resolves into Root and Env
	// (a name of its image store); backends ignore it.
	Template string `json:",omitempty"`
}

// The homes a sandbox user may have (Spec.Home).
const (
	HomeWorkspace = "/workspace"
	HomeUser      = "/home/user"
)

// HomeDir is the spec's home, the default filled in.
func (s Spec) HomeDir() string {
	if s.Home == "" {
		return HomeWorkspace
	}
	return s.Home
}

// UserEnv is who's environment: HOME, USER and LOGNAME of the sandbox user
// ("" or UserSandbox) or of its root (UserRoot), with the spec's Env over
// them.
func (s Spec) UserEnv(who string) map[string]string {
	env := map[string]string{"HOME": s.HomeDir(), "USER": s.UserName(), "LOGNAME": s.UserName()}
	if who == UserRoot {
		env = map[string]string{"HOME": "/root", "USER": "root", "LOGNAME": "root"}
	}
	for k, v := range s.Env {
		env[k] = v
	}
	return env
}

// UserName is the name of the sandbox user: its template's USER's name,
// else one that depends on its home.
func (s Spec) UserName() string {
	if u := s.SandboxUser(); u.Name != "" {
		return u.Name
	}
	if s.HomeDir() == HomeUser {
		return "user"
	}
	return "sandbox"
}

// ValidTenant checks a tenant's name: 1 to 64 letters, digits, '_' and
// '-', as API key ids are.
func ValidTenant(name string) error {
	ok := len(name) > 0 && len(name) <= 64
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("%w: invalid tenant %q (1 to 64 letters, digits, '_' or '-')", ErrInvalidSpec, name)
	}
	return nil
}

// DefaultPython is the interpreter sandboxes run unless told otherwise.
const DefaultPython = "/usr/bin/python3"

// Validate checks a spec before any resource is taken.
func (s Spec) Validate() error {
	if err := s.Limits.Validate(); err != nil {
		return err
	}
	for k, v := range s.Env {
		if err := validEnv(k, v); err != nil {
			return err
		}
	}
	if s.Tenant != "" {
		if err := ValidTenant(s.Tenant); err != nil {
			return err
		}
	}
	if s.Home != "" && s.Home != HomeWorkspace && s.Home != HomeUser {
		return fmt.Errorf("%w: home must be %s or %s, got %q", ErrInvalidSpec, HomeWorkspace, HomeUser, s.Home)
	}
	if s.Python != "" && !strings.HasPrefix(s.Python, "/") {
		return fmt.Errorf("%w: python must be an absolute path, got %q", ErrInvalidSpec, s.Python)
	}
	if err := s.Root.validate(); err != nil {
		return err
	}
	return validVolumes(s.Volumes)
}

// CheckSpec validates spec for backend b: Validate, then what b cannot
// give a sandbox is refused, naming b (CheckEgress, CheckVolumes), never
// dropped silently. For the backends whose Create has no more to check of
// network access and volumes.
func CheckSpec(b Backend, spec Spec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	if err := CheckEgress(b, spec); err != nil {
		return err
	}
	if err := CheckRoot(b, spec); err != nil {
		return err
	}
	return CheckVolumes(b, spec)
}

func validEnv(k, v string) error {
	if k == "" || strings.ContainsAny(k, "=\x00") {
		return fmt.Errorf("%w: invalid environment variable name %q", ErrInvalidSpec, k)
	}
	if strings.Contains(v, "\x00") {
		return fmt.Errorf("%w: environment variable %s contains a NUL byte", ErrInvalidSpec, k)
	}
	return nil
}

// ValidateEnv checks environment variables passed with an execution.
func ValidateEnv(env map[string]string) error {
	for k, v := range env {
		if err := validEnv(k, v); err != nil {
			return err
		}
	}
	return nil
}
