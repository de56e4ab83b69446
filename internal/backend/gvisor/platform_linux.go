package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/agent"
	"github.com/vivarium-sandbox/vivarium/internal/backend/container"
	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// A runsc platform is how gVisor's kernel traps the code's system calls.
// Which ones work is a property of the host that no file tells: on a
// nested virtual machine /dev/kvm opens, yet runsc's kvm platform never
// starts a sandbox. So a platform is used only once a sandbox has been
// seen to start with it and its agent has answered, and each try is
// bounded (ProbeTimeout): a platform that hangs costs seconds, once.

// DefaultProbeTimeout bounds one platform's try: a sandbox with a working
// platform answers in well under a second on an idle machine, a few on a
// busy one; seen on a loaded CI machine (two cores, the whole suite
// running), neither ptrace nor kvm started one within 10 s, and the
// backend refused the host. A platform that hangs costs this, once.
const DefaultProbeTimeout = 30 * time.Second

// PlatformOrder is the order platforms are tried in where none is asked
// for, following gVisor's platform guide: on bare metal kvm is the fastest
// (hardware address spaces), then systrap (gVisor's default since 2023,
// needs no /dev/kvm), then ptrace (works everywhere, the slowest system
// calls). Inside a virtual machine kvm would be nested virtualisation,
// slow where it works at all and not recommended for production, so it is
// tried last there. A runsc older than systrap (Debian 12's) refuses it at
// once, and the next is tried.
func PlatformOrder(inVM bool) []string {
	if inVM {
		return []string{"systrap", "ptrace", "kvm"}
	}
	return []string{"kvm", "systrap", "ptrace"}
}

// InVirtualMachine reports whether the CPU says a hypervisor runs this
// host (the "hypervisor" flag x86 guests see).
func InVirtualMachine() bool {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "flags") && strings.Contains(line+" ", " hypervisor ") {
			return true
		}
	}
	return false
}

// Choice is the platform a backend uses and how it was chosen.
type Choice struct {
	Platform string
	// Requested: the configuration named it; nothing else was tried.
	Requested bool
	// Rejected are the platforms tried before it, in order, and why.
	Rejected []Rejection
}

// Rejection is a platform that did not start a sandbox.
type Rejection struct {
	Platform string
	Err      error
}

// String is the choice as a line of the doctor's report and the server's
// log: "systrap (kvm did not start a sandbox within 10s)".
func (c Choice) String() string {
	s := c.Platform
	switch {
	case c.Requested:
		s += " (requested)"
	case len(c.Rejected) > 0:
		var why []string
		for _, r := range c.Rejected {
			why = append(why, r.Err.Error())
		}
		s += " (" + strings.Join(why, "; ") + ")"
	}
	return s
}

// errNoAnswer is a platform whose sandbox did not answer in time.
type errNoAnswer struct {
	platform string
	timeout  time.Duration
}

func (e errNoAnswer) Error() string {
	return fmt.Sprintf("%s did not start a sandbox within %v", e.platform, e.timeout)
}

// probeFunc starts a sandbox on a platform and returns once its agent has
// answered (nil) or it cannot (why), giving up when ctx ends.
type probeFunc func(ctx context.Context, platform string) error

var validPlatform = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`) })

// choose returns the first of candidates whose probe succeeds within
// timeout. A probe that does not return once its context has ended is
// not waited for beyond a grace period.
func choose(ctx context.Context, candidates []string, timeout time.Duration, probe probeFunc) (Choice, error) {
	var c Choice
	for _, p := range candidates {
		if !validPlatform().MatchString(p) {
			c.Rejected = append(c.Rejected, Rejection{p, fmt.Errorf("%q is not a platform name", p)})
			continue
		}
		err := probeWithin(ctx, p, timeout, probe)
		if err == nil {
			c.Platform = p
			return c, nil
		}
		c.Rejected = append(c.Rejected, Rejection{p, err})
		if ctx.Err() != nil {
			break
		}
	}
	var why []string
	for _, r := range c.Rejected {
		why = append(why, r.Err.Error())
	}
	return c, errors.New(strings.Join(why, "; "))
}

// probeGrace is how long a probe gets, after its time is up, to end the
// sandbox it started before it is abandoned.
const probeGrace = 10 * time.Second

func probeWithin(ctx context.Context, platform string, timeout time.Duration, probe probeFunc) error {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- probe(pctx, platform) }()
	var err error
	select {
	case err = <-done:
	case <-pctx.Done():
		select {
		case err = <-done:
		case <-time.After(probeGrace):
			err = pctx.Err()
		}
	}
	if err != nil && errors.Is(pctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
		return errNoAnswer{platform, timeout}
	}
	var late errNoAnswer
	if err != nil && !errors.As(err, &late) {
		err = fmt.Errorf("%s: %w", platform, err)
	}
	return err
}

// probed caches, per process, the platform a runsc binary was seen to
// work with, so that the backends a process opens (a test binary's, the
// server's several) pay the probe once. Only successes are kept: a
// failure may have been a busy moment, and is tried again.
//
// Nothing is kept across processes: where the order above holds, the
// probe costs one short-lived sandbox (a fraction of a second) and a
// refusal from a runsc that does not know systrap; a cache on disk would
// save that much and could pin a platform the host no longer runs well.
var probed struct {
	sync.Mutex
	m map[string]Choice
}

// selectPlatform returns the platform r's sandboxes use: the one asked
// for, if a sandbox starts with it, or the first in PlatformOrder that
// starts one.
func (r *Runtime) selectPlatform(ctx context.Context) (Choice, error) {
	key := r.cfg.Runsc + "\x00" + r.cfg.Platform
	probed.Lock()
	defer probed.Unlock()
	if c, ok := probed.m[key]; ok {
		return c, nil
	}
	timeout := r.cfg.ProbeTimeout
	if timeout <= 0 {
		timeout = DefaultProbeTimeout
	}
	var c Choice
	var err error
	if r.cfg.Platform != "" {
		c, err = choose(ctx, []string{r.cfg.Platform}, timeout, r.probe)
		c.Requested = true
		if err != nil {
			return c, fmt.Errorf("%w: gvisor: the requested runsc platform %s (leave the platform unset to use the first of %s that starts a sandbox here)",
				sandbox.ErrUnsupported, err, strings.Join(PlatformOrder(InVirtualMachine()), ", "))
		}
	} else {
		order := PlatformOrder(InVirtualMachine())
		if c, err = choose(ctx, order, timeout, r.probe); err != nil {
			return c, fmt.Errorf("%w: gvisor: no runsc platform starts a sandbox on this host (tried %s): %v",
				sandbox.ErrUnsupported, strings.Join(order, ", "), err)
		}
	}
	if probed.m == nil {
		probed.m = map[string]Choice{}
	}
	probed.m[key] = c
	return c, nil
}

// probe starts a sandbox as every sandbox is started (the same bundle,
// mounts, cgroup and flags) on the given platform, but gives its agent no
// configuration: the agent, PID 1 inside, then answers with the error
// frame that says so and exits. That frame is the proof the platform runs
// code. Whatever happens, the sandbox is ended and its state, cgroup and
// directories removed before probe returns.
func (r *Runtime) probe(ctx context.Context, platform string) (err error) {
	dir, l, done, err := r.probeLaunch()
	if err != nil {
		return err
	}
	defer done()
	id := l.ID
	bundle := filepath.Join(dir, "bundle")
	if err := os.Mkdir(bundle, 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(r.spec(l, r.root)) // a probe's sandbox has no template
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		return err
	}
	root := filepath.Join(dir, "runsc")
	cmd := exec.Command(r.cfg.Runsc, append(runscArgs(root, platform), "run", "--bundle", bundle, "vivarium-"+id)...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	// runsc's children (gofer, sandbox) may hold stderr open after it is
	// killed; their cgroup ends them, and Wait does not wait for them.
	cmd.WaitDelay = time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("runsc run: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	answered := make(chan error, 1)
	go func() { answered <- readProbeAnswer(stdout) }()

	select {
	case err = <-answered:
		// The agent exits after its answer, and the sandbox with it;
		// a runsc that failed has ended or is about to.
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
		case <-ctx.Done():
		}
	case <-ctx.Done():
		err = ctx.Err()
	}
	// End what is left: runsc run (its sandbox dies with it), then
	// runsc's own delete, bounded, for any state it kept; the deferred
	// clean-up above then ends the rest through the cgroup.
	select {
	case <-exited:
	default:
		cmd.Process.Kill()
		<-exited
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		exec.CommandContext(dctx, r.cfg.Runsc, append(runscArgs(root, platform), "delete", "--force", "vivarium-"+id)...).Run()
		cancel()
	}
	if errors.Is(err, errEnded) {
		// runsc's last words say why ("unknown platform: systrap").
		if msg := lastLine(stderr.String()); msg != "" {
			err = fmt.Errorf("runsc: %s", msg)
		}
	}
	return err
}

var errEnded = errors.New("the sandbox ended without an answer")

// readProbeAnswer reads the agent's first frame: the error it reports for
// a missing configuration.
func readProbeAnswer(r io.Reader) error {
	f, err := agent.NewReader(r).Next()
	if errors.Is(err, io.EOF) || errors.Is(err, os.ErrClosed) {
		// Closed: runsc exited and its pipe was closed under the read.
		return errEnded
	}
	if err != nil {
		return fmt.Errorf("the sandbox's answer: %w", err)
	}
	var c agent.Ctl
	if f.Kind != agent.KindCtl || json.Unmarshal(f.Data, &c) != nil || c.Op != agent.OpError || c.Step != "read config" {
		return fmt.Errorf("the sandbox answered an unexpected frame (kind %d)", f.Kind)
	}
	return nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	l := strings.TrimSpace(lines[len(lines)-1])
	if len(l) > 200 {
		l = l[:200] + "…"
	}
	return l
}

// removeCgroupDirs removes the (empty) group rel in every cgroup hierarchy
// mounted here. A group whose last processes have been killed but not yet
// reaped is busy (EBUSY): runsc's gofer and sandbox, orphaned when runsc
// ends, are reaped by the host's init, which may take tens of
// milliseconds. It is tried again, for up to cgroupReapTimeout.
func removeCgroupDirs(rel string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var dirs []string
	for _, line := range strings.Split(string(b), "\n") {
		// "36 35 0:31 / /sys/fs/cgroup/cpuset rw,... - cgroup cgroup rw,cpuset"
		pre, post, ok := strings.Cut(line, " - ")
		fields, fstype := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(fstype) < 1 || (fstype[0] != "cgroup" && fstype[0] != "cgroup2") {
			continue
		}
		dirs = append(dirs, filepath.Join(fields[4], rel))
	}
	deadline := time.Now().Add(cgroupReapTimeout)
	delay := time.Millisecond
	for {
		var busy []string
		for _, d := range dirs {
			if err := os.Remove(d); errors.Is(err, unix.EBUSY) {
				busy = append(busy, d)
			}
		}
		if len(busy) == 0 || time.Now().After(deadline) {
			return
		}
		dirs = busy
		time.Sleep(delay)
		delay = min(2*delay, 50*time.Millisecond)
	}
}

// cgroupReapTimeout bounds the wait for a group's killed processes to be
// reaped.
const cgroupReapTimeout = 2 * time.Second

// probeLaunch makes what a probe's sandbox is started from: a directory
// of its own under the state directory (dir), a disk, default limits and
// a cgroup. done removes them: whatever still runs in the cgroup, then
// the groups runsc made in the hierarchies Vivarium does not manage
// (cgroup v1's cpuset, devices, blkio...), which a runsc that was killed
// leaves, then the directory.
func (r *Runtime) probeLaunch() (dir string, l container.Launch, done func(), err error) {
	dir, err = os.MkdirTemp(r.cfg.StateDir, "probe-")
	if err != nil {
		return "", l, nil, err
	}
	var cg cgroups.Group
	done = func() {
		if cg != nil {
			cg.Destroy()
			r.removeCgroups(filepath.Join(r.cgroupParent, filepath.Base(dir)))
		}
		os.RemoveAll(dir)
	}
	id := filepath.Base(dir)
	disk := container.Disk{Dir: filepath.Join(dir, "disk")}
	disk.Workspace, disk.Tmp, disk.Shm = filepath.Join(disk.Dir, "workspace"), filepath.Join(disk.Dir, "tmp"), filepath.Join(disk.Dir, "shm")
	for _, d := range []string{disk.Workspace, disk.Tmp, disk.Shm} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			done()
			return "", l, nil, err
		}
	}
	limits := sandbox.Limits{}.WithDefaults()
	l = container.Launch{ID: id, Spec: sandbox.Spec{Limits: limits}, Disk: disk}
	if r.cgroups != nil {
		if cg, err = r.cgroups.New(id, cgroups.Limits{MemoryBytes: limits.Memory, Pids: hostPids(limits.Pids)}); err != nil {
			cg = nil
			done()
			return "", l, nil, err
		}
		l.Cgroup = cg
	}
	return dir, l, done, nil
}
