// Package testbackends opens every backend a test suite runs against, as
// one table: the native backend (with runners forked from a zygote in the
// zygote mode of testutil.RunBothModes), gVisor where runsc is installed,
// wasm where its interpreter is built, and, for suites that ask for them,
// docker in a daemon of the test binary's own (testutil.RequireDockerd)
// and the native backend again for every case under a network allowlist.
// Each suite gets cgroups, uids and state directories of its own, so that
// suites testing at the same time do not see each other's sandboxes as
// leftovers; what a suite's cases expect of each backend (its differences)
// is the suite's, keyed by Backend.Name.
package testbackends

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/docker"
	"github.com/vivarium-sandbox/vivarium/internal/backend/gvisor"
	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/backend/wasm"
	"github.com/vivarium-sandbox/vivarium/internal/hostuid"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// Backend is one backend under test.
type Backend struct {
	Name string
	B    sandbox.Backend
	// SandboxUID is the host uid the sandbox user maps to, or -1 where
	// the sandbox's users are not the host's (gVisor's and wasm's are
	// their own; every docker sandbox is a host user of its own, of the
	// pool DockerUIDs names).
	SandboxUID int
	// Allowlist: the suite gives every sandbox a network allowlist, its
	// proxy in the sandbox (the native-allowlist backend). What the
	// allowlist names is the suite's.
	Allowlist bool
	// Root, for native-template, is the template's root every sandbox of
	// the suite has (testutil.SuiteTemplateRoot: the host's python3 and
	// a few programs, under a layer of hostile links).
	Root *sandbox.Root
	// Leftovers closes the backend and lists what its sandboxes left on
	// the host: processes, cgroups, state directories, containers, and
	// the docker backend's test daemon (stopped, so that its processes
	// and mounts are gone before the suite checks the host). Call it
	// once, after every sandbox was closed. A test that ends before
	// calling it still closes the backend (t.Cleanup).
	Leftovers func() []string
}

// Names are the backends Open knows, which a suite's Env may name and its
// tables of differences be keyed by.
var Names = []string{"native", "native-zygote", "native-allowlist", "native-template", "gvisor", "wasm", "docker"}

// Suite names a test suite's resources.
type Suite struct {
	// Name is short and unique among suites: "conformance", "hostile".
	Name string
	// UIDBase is the native backend's uid base, unique among suites.
	UIDBase uint32
	// Env is the variable that selects backends, comma separated
	// (native, native-zygote, native-allowlist, gvisor, wasm, docker);
	// empty: all available.
	Env string
	// Preload is what the native backend's zygote imports.
	Preload []string
	// Docker adds the docker backend to the defaults, where dockerd is
	// installed and the tests run as root. It runs in a daemon started for
	// the test binary, which the backend's Leftovers stops; the suite's
	// TestMain must stop it too (testutil.StopDockerd): a test can fail
	// once the daemon has started and before the backend is open.
	Docker bool
	// Allowlist adds native-allowlist to the defaults: the native
	// backend, whose every case the suite runs with a network allowlist
	// set (Backend.Allowlist).
	Allowlist bool
	// Template adds native-template to the defaults: the native backend,
	// whose every case the suite runs in a template's sandbox
	// (Backend.Root).
	Template bool
}

// Open returns the backends to test: those Env names, or every one this
// machine can run. The native backend is always among the defaults, and
// native-template where the suite runs templates; the others are tested
// in the classic mode only (not again with a zygote, which is the native
// backend's). Each is closed when t ends, if
// Leftovers has not closed it by then.
func Open(t *testing.T, s Suite) []Backend {
	t.Helper()
	names := os.Getenv(s.Env)
	if names == "" {
		names = "native"
		if testutil.ZygoteMode() {
			names = "native-zygote"
			if s.Template {
				// A template's sandboxes forked from its zygote.
				names += ",native-template"
			}
		} else {
			if s.Allowlist {
				names += ",native-allowlist"
			}
			if s.Template {
				names += ",native-template"
			}
			if err := gvisor.Check(); err == nil {
				names += ",gvisor"
			} else {
				t.Logf("not testing the gvisor backend: %v", err)
			}
			if _, err := wasm.Locate(); err == nil {
				names += ",wasm"
			} else {
				t.Logf("not testing the wasm backend: %v", err)
			}
			if s.Docker {
				if _, err := exec.LookPath("dockerd"); err == nil && os.Geteuid() == 0 {
					names += ",docker"
				} else {
					t.Logf("not testing the docker backend: needs root and dockerd (apt install docker.io)")
				}
			}
		}
	}
	var out []Backend
	for _, name := range strings.Split(names, ",") {
		var be Backend
		switch {
		case name == "docker" && !s.Docker:
			t.Fatalf("%s=%q: the %s suite does not stop a test daemon (Suite.Docker)", s.Env, names, s.Name)
		case name == "native-allowlist" && !s.Allowlist:
			t.Fatalf("%s=%q: the %s suite sets no allowlist (Suite.Allowlist)", s.Env, names, s.Name)
		case name == "native-template" && !s.Template:
			t.Fatalf("%s=%q: the %s suite runs no template (Suite.Template)", s.Env, names, s.Name)
		case name == "docker":
			be = openDocker(t, s)
		default:
			var err error
			if be, err = open(name, s); err != nil {
				t.Fatalf("%s backend: %v", name, err)
			}
			if name == "native-template" {
				be.Root = testutil.SuiteTemplateRoot(t)
			}
		}
		out = append(out, closedAtEnd(t, be))
	}
	return out
}

// closedAtEnd makes Leftovers run at most once, and closes be when t ends
// if a failed test never called it: neither a zygote nor a daemon may
// outlive the test binary.
func closedAtEnd(t *testing.T, be Backend) Backend {
	leftovers := sync.OnceValue(be.Leftovers)
	be.Leftovers = leftovers
	t.Cleanup(func() { leftovers() })
	return be
}

func open(name string, s Suite) (Backend, error) {
	parent := "vivarium-" + s.Name + "-test"
	switch name {
	case "native", "native-zygote", "native-allowlist", "native-template":
		// native-template's sandboxes are forked from the template's
		// zygote in the zygote mode's run, started one by one in the other.
		zygote := name == "native-zygote" || name == "native-template" && testutil.ZygoteMode()
		var preload []string
		if zygote {
			preload = s.Preload
		}
		b, err := native.New(native.Config{CgroupParent: parent, UIDBase: s.UIDBase, UIDRanges: testutil.UIDRanges, Zygote: zygote, Preload: preload})
		if err != nil {
			return Backend{}, err
		}
		testutil.RemoveStaleCgroups(parent)
		return Backend{Name: name, B: b, SandboxUID: int(s.UIDBase) + native.SandboxUID, Allowlist: name == "native-allowlist",
			Leftovers: func() []string {
				b.Close() // the zygote, if any, is the backend's, not a sandbox's
				left := testutil.ProcessesOwnedBy(int(s.UIDBase), int(s.UIDBase)+testutil.UIDSpan)
				return append(left, testutil.CgroupsUnder(parent)...)
			}}, nil
	case "gvisor":
		parent += "-gvisor"
		dir := "/run/vivarium/" + s.Name + "-test-gvisor"
		b, err := gvisor.New(gvisor.Config{CgroupParent: parent, StateDir: dir})
		if err != nil {
			return Backend{}, err
		}
		if err := sweep(b); err != nil {
			return Backend{}, err
		}
		return Backend{Name: name, B: b, SandboxUID: -1, Leftovers: func() []string {
			var left []string
			if err := b.Close(); err != nil {
				left = append(left, "closing the backend: "+err.Error())
			}
			left = append(left, testutil.CgroupsUnder(parent)...)
			if entries, _ := os.ReadDir(filepath.Join(dir, "sandboxes")); len(entries) > 0 {
				left = append(left, fmt.Sprintf("%d sandbox directories in %s", len(entries), dir))
			}
			if roots, _ := filepath.Glob(filepath.Join(dir, "root-*")); len(roots) > 0 {
				left = append(left, fmt.Sprintf("root skeletons %v", roots))
			}
			return left
		}}, nil
	case "wasm":
		b, err := wasm.New(wasm.Config{})
		if err != nil {
			return Backend{}, err
		}
		if err := b.Warm(context.Background()); err != nil {
			return Backend{}, err
		}
		// In-process: a sandbox is memory of this process; nothing of it
		// exists outside.
		return Backend{Name: name, B: b, SandboxUID: -1, Leftovers: func() []string { b.Close(); return nil }}, nil
	}
	return Backend{}, fmt.Errorf("%s: unknown backend %q", s.Env, name)
}

// openDocker opens the docker backend on the test binary's daemon, with a
// name (its containers' label, cgroup parent, state directory) holding
// the daemon's own suffix: apart from the same suite run at once by
// another process.
func openDocker(t *testing.T, s Suite) Backend {
	t.Helper()
	d := testutil.RequireDockerd(t)
	name := "vivarium-" + s.Name + "-test-docker-" + strings.TrimPrefix(filepath.Base(d.Dir), "vd-")
	dir := "/run/vivarium/" + strings.TrimPrefix(name, "vivarium-")
	uidBase, uidEnd := DockerUIDs(s.UIDBase)
	b, err := docker.New(docker.Config{Host: d.Host, Name: name, StateDir: dir, UIDBase: uidBase,
		UIDRanges: int(uidEnd-uidBase) / hostuid.RangeSize})
	if err != nil {
		t.Fatalf("docker backend: %v", err)
	}
	// Every sandbox is a host user of its own, of the suite's pool.
	return Backend{Name: "docker", B: b, SandboxUID: -1, Leftovers: func() []string {
		var left []string
		if err := b.Close(); err != nil {
			left = append(left, "closing the backend: "+err.Error())
		}
		if ids, err := docker.Containers(d.Host, name); err != nil || len(ids) > 0 {
			left = append(left, fmt.Sprintf("containers %v (%v)", ids, err))
		}
		left = append(left, testutil.CgroupsUnder(name)...)
		if parents, _ := filepath.Glob("/sys/fs/cgroup/*/" + name); len(parents) > 0 {
			left = append(left, fmt.Sprintf("cgroup parents %v", parents))
		}
		if entries, _ := os.ReadDir(filepath.Join(dir, "sandboxes")); len(entries) > 0 {
			left = append(left, fmt.Sprintf("%d sandbox directories in %s", len(entries), dir))
		}
		if roots, _ := filepath.Glob(filepath.Join(dir, "root-*")); len(roots) > 0 {
			left = append(left, fmt.Sprintf("root skeletons %v", roots))
		}
		if views, _ := filepath.Glob(filepath.Join(dir, "views", "*")); len(views) > 0 {
			left = append(left, fmt.Sprintf("container views %v", views))
		}
		left = append(left, testutil.ProcessesOwnedBy(int(uidBase), int(uidEnd))...)
		os.RemoveAll(dir)
		if err := testutil.StopDockerd(); err != nil {
			left = append(left, "stopping the test dockerd: "+err.Error())
		}
		return left
	}}
}

// DockerUIDs are the host uids [first, end) of the docker backend's pool
// of the suite whose native uid base is nativeBase: 64 ranges above the
// docker backend's default pool, apart from every other suite's (the
// native bases are native.DefaultUIDBase + k<<24; the docker pools
// docker.DefaultUIDBase + DefaultUIDRanges ranges + k<<22, below 2^31
// for k up to 18).
func DockerUIDs(nativeBase uint32) (first, end uint32) {
	k := (nativeBase - native.DefaultUIDBase) >> 24
	first = docker.DefaultUIDBase + docker.DefaultUIDRanges*hostuid.RangeSize + k<<22
	return first, first + 1<<22
}

// sweep removes what an earlier run of the same suite left when it was
// killed (its cgroups, containers, state), so that the leftovers this run
// checks for are its own. The suite owns its cgroup parent and state
// directory: nothing else uses them.
func sweep(b sandbox.Backend) error {
	sw, ok := b.(sandbox.Sweeper)
	if !ok {
		return nil
	}
	_, err := sw.Sweep()
	return err
}
