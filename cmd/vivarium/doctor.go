package main

import (
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/backend/docker"
	"github.com/vivarium-sandbox/vivarium/internal/backend/gvisor"
	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/backend/wasm"
	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/image"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/seccomp"
	"github.com/vivarium-sandbox/vivarium/internal/volume"
)

// check is one line of the doctor's report.
type check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	// Optional checks are about a backend that is not the default: a
	// failure is reported, but does not fail the doctor.
	Optional bool `json:"optional,omitempty"`
}

func cmdDoctor(args []string) int {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the checks as JSON")
	var diskOf listFlag
	fs.Var(&diskOf, "io-disk-of", "check with the disk that holds `DIR` too, as serve --io-disk-of (repeatable)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if len(diskOf) > 0 {
		if err := cgroups.AddIODisksOf(diskOf...); err != nil {
			fmt.Fprintf(os.Stderr, "vivarium doctor: --io-disk-of: %v\n", err)
			return 2
		}
	}
	checks := append(doctorChecks(), binaryCheck(), gvisorCheck(), dockerCheck(), wasmCheck(), checkpointCheck())
	if *asJSON {
		json.NewEncoder(os.Stdout).Encode(checks)
	} else {
		for _, c := range checks {
			mark := "ok  "
			switch {
			case !c.OK && c.Optional:
				mark = "n/a "
			case !c.OK:
				mark = "FAIL"
			}
			fmt.Printf("%s  %-22s %s\n", mark, c.Name, c.Detail)
		}
	}
	for _, c := range checks {
		if !c.OK && !c.Optional {
			return 1
		}
	}
	return 0
}

// binaryCheck says what every sandbox starts inside itself: the init
// program this binary carries (scripts/build.sh), or, in a binary built
// otherwise, this whole binary again, which costs each sandbox about 3 ms
// more CPU, and 2.5 ms more if it is dynamically linked (the dynamic
// loader runs each time). Advice, not a failure.
func binaryCheck() check {
	c := check{Name: "binary", Optional: true}
	path, err := installedInitProg()
	if err == nil {
		c.OK, c.Detail = true, "sandboxes start the init program built in, written to "+path
		return c
	}
	c.Detail = err.Error() + ": every sandbox starts this whole binary again (about 3 ms more CPU each)"
	exe, err := os.Executable()
	if err != nil {
		return c
	}
	f, err := elf.Open(exe)
	if err != nil {
		return c
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			c.Detail += ", and it is dynamically linked: each runs the dynamic loader too"
		}
	}
	return c
}

// wasmCheck reports whether the wasm backend can run: its interpreter is
// built (or why not), and a real wasm sandbox runs code.
func wasmCheck() check {
	return backendCheck("wasm backend", func() (closingBackend, string, error) {
		b, err := wasm.New(wasm.Config{})
		if err != nil {
			return nil, "", err
		}
		return b, "interpreter in " + b.Dir(), nil
	})
}

// gvisorCheck reports whether the gvisor backend can run: runsc is there,
// and a real gVisor sandbox runs code.
func gvisorCheck() check {
	return backendCheck("gvisor backend", func() (closingBackend, string, error) {
		if err := gvisor.Check(); err != nil {
			return nil, "", err
		}
		b, err := gvisor.New(gvisor.Config{CgroupParent: "vivarium-doctor-gvisor"})
		if err != nil {
			return nil, "", err
		}
		return b, "runsc platform " + b.Platform().String(), nil
	})
}

// checkpointCheck reports whether checkpoint/restore (pause, resume,
// fork, snapshots: docs/snapshots.md) can work on this host: a criu
// binary of 4.x is found and `criu check` passes. Optional: sandboxes
// run without it, and are not pausable.
func checkpointCheck() check {
	const name = "checkpoint/restore"
	bin, err := criu.Find()
	if err != nil {
		return check{Name: name, Optional: true, Detail: err.Error()}
	}
	v, _ := criu.Version(bin)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	said, err := criu.Check(ctx, bin)
	if err != nil {
		return check{Name: name, Optional: true, Detail: fmt.Sprintf("%s (criu %s) fails: %v", bin, v, err)}
	}
	detail := fmt.Sprintf("criu %s at %s: criu check says %q", v, bin, said)
	if _, err := native.Nsenter(); err != nil {
		return check{Name: name, Optional: true, Detail: detail + "; but " + err.Error()}
	}
	switch missing := criu.MissingPatches(bin, criu.SpeedPatches); {
	case len(missing) > 0:
		detail += fmt.Sprintf("; built without %s, so each pause and resume is about 30 ms slower, a resume on cgroup v1 up to 50 (`make criu` builds a criu with them)",
			strings.Join(missing, ", "))
	case criu.ProbeCache() != "":
		detail += "; its kernel probes kept in " + criu.ProbeCache()
	default:
		detail += "; its kernel probes not kept (no directory of this user's on a tmpfs under /dev/shm), about 25 ms of each pause and resume"
	}
	return check{Name: name, OK: true, Optional: true, Detail: detail}
}

// closingBackend is a backend that frees what it keeps when closed.
type closingBackend interface {
	sandbox.Backend
	Close() error
}

// dockerCheck reports whether the docker backend can run: a daemon answers
// at $DOCKER_HOST or the usual socket, and a real container sandbox runs
// code; otherwise why not (not installed, daemon not running, API too old).
func dockerCheck() check {
	return backendCheck("docker backend", func() (closingBackend, string, error) {
		about, err := docker.Check("", "")
		if err != nil {
			return nil, "", err
		}
		b, err := docker.New(docker.Config{Name: "vivarium-doctor-docker"})
		if err != nil {
			return nil, "", err
		}
		return b, about, nil
	})
}

// backendCheck runs one sandbox of an optional backend.
func backendCheck(name string, open func() (closingBackend, string, error)) check {
	fail := func(err error) check { return check{Name: name, Detail: err.Error(), Optional: true} }
	b, note, err := open()
	if err != nil {
		return fail(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	res, _ := sandbox.RunOnce(ctx, b, sandbox.OneShot{Request: sandbox.ExecRequest{
		Code: `import sys; print("CPython " + sys.version.split()[0] + " on " + sys.platform)`}})
	if res.Status != sandbox.StatusOK {
		msg := string(res.Status)
		if res.Error != nil {
			msg += ": " + res.Error.Value
		}
		return fail(errors.New(msg))
	}
	detail := fmt.Sprintf("works (%s, %v", strings.TrimSpace(res.Stdout), time.Since(start).Round(time.Millisecond))
	if note != "" {
		detail += "; " + note
	}
	return check{Name: name, OK: true, Optional: true, Detail: detail + ")"}
}

func doctorChecks() []check {
	var out []check
	add := func(name string, err error, okDetail string) {
		if err != nil {
			out = append(out, check{Name: name, Detail: err.Error()})
		} else {
			out = append(out, check{Name: name, OK: true, Detail: okDetail})
		}
	}
	var uts unix.Utsname
	unix.Uname(&uts)
	out = append(out, check{Name: "kernel", OK: true, Detail: fmt.Sprintf("%s %s", unix.ByteSliceToString(uts.Release[:]), runtime.GOARCH)})

	var rootErr error
	if os.Geteuid() != 0 {
		rootErr = errors.New("not root: the native backend needs root")
	}
	add("root", rootErr, "running as root")

	userns := "enabled"
	var usernsErr error
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err != nil {
		usernsErr = errors.New("not available in this kernel (CONFIG_USER_NS)")
	} else if v := strings.TrimSpace(string(b)); v == "0" {
		usernsErr = errors.New("disabled: sysctl -w user.max_user_namespaces=15000")
	} else {
		userns = "max_user_namespaces=" + v
	}
	add("user namespaces", usernsErr, userns)

	actions, _ := os.ReadFile("/proc/sys/kernel/seccomp/actions_avail")
	add("seccomp filters", seccomp.Supported(), strings.TrimSpace(string(actions)))

	_, err := unix.Openat2(unix.AT_FDCWD, "/", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC})
	if err == unix.ENOSYS {
		add("openat2", errors.New("missing (Linux 5.6+): needed for confined workspace access"), "")
	} else {
		add("openat2", nil, "available")
	}

	// Every native sandbox's root is made of read-only overlays: probed
	// in a user namespace of its own, as a sandbox's init mounts them.
	if rootErr == nil {
		add("overlayfs", native.CheckOverlay(), "read-only overlays in user namespaces: each sandbox sees /usr through inodes of its own")
		c := check{Name: "image roots", OK: true, Optional: true,
			Detail: "an image's layers (vivarium image), idmapped to a user namespace, attach there as a root of its own"}
		if err := image.CheckRootMount(); err != nil {
			c.OK, c.Detail = false, err.Error()
		}
		out = append(out, c)
	}

	if m, err := cgroups.Detect(""); err != nil {
		add("cgroups", err, "")
		out = append(out, check{Name: "memory ceilings", Optional: true, Detail: "none without cgroups (vivarium serve " +
			"--insecure-no-cgroups): nothing bounds the memory of a key's sandboxes, or of all, together, nor what a " +
			"sandbox hands to another before it ends"})
	} else {
		detail := fmt.Sprintf("v%d", m.Version())
		if m.Version() == 1 {
			detail += " (memory, pids, cpuacct controllers; CPU time by polling; "
			var err error = errors.New("not offered")
			if h, ok := m.(cgroups.ThreadHome); ok {
				var home []*os.File
				if home, err = h.ThreadTaskFiles(); err == nil {
					for _, f := range home {
						f.Close()
					}
				}
			}
			if err == nil {
				detail += "a sandbox's processes start in its group)"
			} else {
				detail += fmt.Sprintf("a sandbox's processes are moved into its group by pid, which waits for the kernel: %v)", err)
			}
		} else {
			detail += " (memory, pids; clone into cgroup)"
		}
		add("cgroups", nil, detail)
		add("disk I/O limits", ioLimitCheck(m), ioLimitDetail())
		shares := "a CPU weight per sandbox and per API key (vivarium serve --tenant-share)"
		if !m.CPUController() {
			shares = "none: no cpu controller, a sandbox of many processes (or a key of many sandboxes) gets more than its share"
		}
		out = append(out, check{Name: "CPU shares", OK: true, Optional: true, Detail: shares})
		add("memory ceilings", m.CheckCeilings(), "per API key and for all sandboxes together (vivarium serve "+
			"--max-memory-per-key, --max-memory-total), what ended sandboxes left to others included: hierarchical memory accounting")
	}

	// A real sandbox, end to end, which also reports the Python stack.
	b, err := native.New(native.Config{})
	if err != nil {
		add("native sandbox", err, "")
		return out
	}
	code := `
import sys, importlib
mods = []
for m in ("numpy", "pandas", "matplotlib", "scipy"):
    try:
        mods.append(m + " " + importlib.import_module(m).__version__)
    except Exception as e:
        mods.append(m + " missing")
print("python " + sys.version.split()[0] + "; " + ", ".join(mods))
`
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	res, _ := sandbox.RunOnce(ctx, b, sandbox.OneShot{Request: sandbox.ExecRequest{Code: code}})
	if res.Status != sandbox.StatusOK {
		msg := string(res.Status)
		if res.Error != nil {
			msg += ": " + res.Error.Value
		}
		add("native sandbox", errors.New(msg), "")
		return out
	}
	add("native sandbox", nil, fmt.Sprintf("works (%v, cgroup v%d)", time.Since(start).Round(time.Millisecond), b.CgroupVersion()))
	add("python in sandbox", nil, strings.TrimSpace(res.Stdout))
	first, last, ranges, inUse, err := b.UIDPool()
	add("host users", err, fmt.Sprintf("every sandbox is a host user of its own: uids %d-%d, %d ranges of 65536, %d in use on this host now",
		first, last, ranges, inUse))
	k := native.DefaultKernelLimits
	add("kernel budgets", nil, fmt.Sprintf("per sandbox: %d inotify instances, %d watches, %d queued signals, %d KiB of message queues, %d KiB locked",
		k.InotifyInstances, k.InotifyWatches, k.PendingSignals, k.MsgQueueBytes>>10, k.LockedMemory>>10))
	pattern, _ := os.ReadFile("/proc/sys/kernel/core_pattern")
	add("core dumps", nil, fmt.Sprintf("sandboxes run with RLIMIT_CORE 1, which the kernel reads as \"no dump\", to a file or to the host's handler (core_pattern %q)",
		strings.TrimSpace(string(pattern))))
	out = append(out, volumeCheck(b))
	return out
}

// volumeCheck reports whether persistent volumes work here, end to end: a
// small volume is made, mounted into a real sandbox that writes to it,
// and read back without it. Optional: a server runs without volumes.
func volumeCheck(b sandbox.Backend) check {
	const name = "volumes"
	fail := func(err error) check { return check{Name: name, Detail: err.Error(), Optional: true} }
	dir, err := os.MkdirTemp("", "vivarium-doctor-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	st, err := volume.Open(volume.Config{Dir: filepath.Join(dir, "volumes"), MaxSize: volume.MinSize})
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	if err := st.Unavailable(); err != nil {
		return fail(err)
	}
	if _, err := st.Create("doctor", "v", 0); err != nil {
		return fail(err)
	}
	l, err := st.Acquire("doctor", "v", true)
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, _ := sandbox.RunOnce(ctx, b, sandbox.OneShot{
		Spec:    sandbox.Spec{Volumes: []sandbox.VolumeMount{{Path: "/mnt/v", Name: "v", Mount: l.Mount}}},
		Request: sandbox.ExecRequest{Code: `open("/mnt/v/probe", "w").write("ok")`}})
	l.Release()
	if res.Status != sandbox.StatusOK {
		msg := string(res.Status)
		if res.Error != nil {
			msg += ": " + res.Error.Value
		}
		return fail(errors.New(msg))
	}
	err = st.Content("doctor", "v", func(_ volume.Volume, d *volume.Dir) error {
		fi, err := d.Stat("probe")
		if err == nil && fi.UID != volume.OwnerUID {
			err = fmt.Errorf("a sandbox's file is uid %d on disk, not %d", fi.UID, volume.OwnerUID)
		}
		return err
	})
	if err != nil {
		return fail(err)
	}
	return check{Name: name, OK: true, Optional: true,
		Detail: "ext4 images on loop devices, mounted idmapped into sandboxes (vivarium serve --volume-max-size)"}
}

// ioLimitCheck: sandboxes get a disk I/O limit by default; a host that
// cannot give one needs --insecure-no-io-limit.
func ioLimitCheck(m cgroups.Manager) error {
	if !m.IOController() {
		name := "blkio"
		if m.Version() == 2 {
			name = "io"
		}
		return fmt.Errorf("no %s cgroup controller: sandboxes cannot start without --insecure-no-io-limit", name)
	}
	_, err := cgroups.IODevices()
	return err
}

func ioLimitDetail() string {
	devs, _ := cgroups.IODevices()
	var names []string
	for _, d := range devs {
		names = append(names, fmt.Sprintf("%s (%s)", d.Name, d))
	}
	return "throttled on " + strings.Join(names, ", ") + " (the disks behind / and /usr, and --io-disk-of)"
}
