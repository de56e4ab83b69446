package native_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// buildStepScript runs as a build step's root: what a Dockerfile's RUN
// does with its capabilities (a file given to another user, a process
// that drops to a user as apt-get does) works; what would reach past the
// step's own user namespace does not.
const buildStepScript = `
import os, errno, ctypes
def caps(pid='self'):
    f = dict(l.split(':\t') for l in open('/proc/%s/status' % pid).read().splitlines() if l.startswith('Cap'))
    return f['CapEff'].strip(), f['CapBnd'].strip()
print('root', *caps(), flush=True)
os.makedirs('/out', exist_ok=True)
open('/out/chowned', 'w').write('x')
os.chown('/out/chowned', 42, 65534)
open('/out/secret', 'w').write('root only'); os.chmod('/out/secret', 0o600)
pid = os.fork()
if pid == 0:
    os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(42, 42, 42)
    try:
        open('/out/secret').read(); print('dropped reads root only', flush=True)
    except PermissionError:
        print('dropped', os.getuid(), *caps(), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
def refused(what, f):
    try:
        f()
        print(what, 'ALLOWED')
    except OSError as e:
        print(what, errno.errorcode[e.errno])
refused('chown /dev/null', lambda: os.chown('/dev/null', 1000, 1000))
refused('chmod /dev/null', lambda: os.chmod('/dev/null', 0o777))
refused('mknod', lambda: os.mknod('/out/mem', 0o666 | 0o020000, os.makedev(1, 1)))
refused('sysctl', lambda: open('/proc/sys/kernel/hostname', 'w').write('x'))
refused('init environ', lambda: open('/proc/1/environ').read())
refused('setuid 65536', lambda: os.setresuid(65536, 65536, 65536))
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs('/mnt', exist_ok=True)
r = libc.mount(b'none', b'/mnt', b'tmpfs', 0, None)
print('mount', 'ALLOWED' if r == 0 else errno.errorcode[ctypes.get_errno()])
`

// A build step's root keeps the capabilities a RUN needs (CAP_CHOWN,
// CAP_SETUID ...; none that mounts, makes devices or traces) in the
// step's own user namespace: they act on the step's own files and ids,
// never on what that namespace does not map. A step as another user has
// none.
func TestBuildStepCapabilities(t *testing.T) {
	b := newBackend(t)
	layers := testutil.TemplateRoot(t).Layers
	ctx := context.Background()
	var log bytes.Buffer
	owners := map[string][2]uint32{}
	step := native.BuildStep{Layers: layers, Args: []string{"python3", "-c", buildStepScript}, Log: &log,
		Env: []string{"PATH=/usr/bin:/bin"},
		Commit: func(upper string, uid0, gid0 uint32) error {
			for _, name := range []string{"out/chowned", "out/secret"} {
				st, err := os.Lstat(filepath.Join(upper, name))
				if err != nil {
					return err
				}
				sys := st.Sys().(*syscall.Stat_t)
				owners[name] = [2]uint32{sys.Uid - uid0, sys.Gid - gid0}
			}
			return nil
		}}
	if err := b.RunBuildStep(ctx, step); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	// CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID, CAP_KILL,
	// CAP_SETGID, CAP_SETUID, CAP_NET_BIND_SERVICE.
	const kept = "00000000000004fb"
	want := strings.Join([]string{
		"root " + kept + " " + kept,
		"dropped 42 0000000000000000 " + kept,
		"chown /dev/null EPERM",
		"chmod /dev/null EPERM",
		"mknod EPERM",
		"sysctl EROFS",
		"init environ EACCES",
		"setuid 65536 EINVAL",
		"mount EPERM",
	}, "\n") + "\n"
	if log.String() != want {
		t.Errorf("the step's root:\n%s\nwant\n%s", log.String(), want)
	}
	if owners["out/chowned"] != [2]uint32{42, 65534} || owners["out/secret"] != [2]uint32{0, 0} {
		t.Errorf("the layer's owners: %v", owners)
	}

	// As another user of the image: its ids, no capability.
	log.Reset()
	step.Args = []string{"sh", "-c", `id -u; id -G; grep CapEff /proc/self/status; echo $HOME`}
	step.UID, step.GID = 1001, 1002
	step.Commit = func(string, uint32, uint32) error { return nil }
	if err := b.RunBuildStep(ctx, step); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if got := log.String(); got != "1001\n1002\nCapEff:\t0000000000000000\n/\n" {
		t.Errorf("a step as 1001:1002 printed %q", got)
	}
	// With the supplementary groups the image gives the user.
	log.Reset()
	step.Groups = []uint32{29, 50}
	if err := b.RunBuildStep(ctx, step); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if got := log.String(); got != "1001\n1002 29 50\nCapEff:\t0000000000000000\n/\n" {
		t.Errorf("a step as 1001:1002 in groups 29 and 50 printed %q", got)
	}
	step.Groups = nil
	for _, c := range []struct {
		ids    [2]uint32
		groups []uint32
	}{{[2]uint32{65536, 0}, nil}, {[2]uint32{0, 70000}, nil}, {[2]uint32{1001, 1002}, []uint32{65536}},
		{[2]uint32{1001, 1002}, make([]uint32, 65)}} {
		step.UID, step.GID, step.Groups = c.ids[0], c.ids[1], c.groups
		if err := b.RunBuildStep(ctx, step); !errors.Is(err, sandbox.ErrInvalidSpec) {
			t.Errorf("a step as %d:%d in %d groups: %v, want an invalid spec", c.ids[0], c.ids[1], len(c.groups), err)
		}
	}
}

// A build step's sandbox is made in its key's group (BuildStep.Tenant),
// as the key's sandboxes are: its builds share the key's CPU and memory.
func TestBuildStepInTenantGroup(t *testing.T) {
	b := newBackend(t)
	const tenant = "build_tenant"
	groups := func() []string {
		var dirs []string
		for _, pattern := range []string{"/sys/fs/cgroup/*/" + cgroupParent + "/" + tenant + "/*",
			"/sys/fs/cgroup/" + cgroupParent + "/" + tenant + "/*"} {
			m, _ := filepath.Glob(pattern)
			for _, p := range m {
				if st, err := os.Stat(p); err == nil && st.IsDir() {
					dirs = append(dirs, p)
				}
			}
		}
		return dirs
	}
	var seen []string
	log := writerFunc(func(p []byte) (int, error) {
		if seen == nil {
			seen = groups() // the step runs on: it sleeps after its first line
		}
		return len(p), nil
	})
	err := b.RunBuildStep(context.Background(), native.BuildStep{Layers: testutil.TemplateRoot(t).Layers,
		Args: []string{"sh", "-c", "echo started; sleep 2"}, Env: []string{"PATH=/usr/bin:/bin"}, Tenant: tenant, Log: log,
		Commit: func(string, uint32, uint32) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) == 0 {
		t.Errorf("no group of the step's under %s/%s while it ran", cgroupParent, tenant)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
