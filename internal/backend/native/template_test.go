package native_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// A template's sandbox runs in the template's root with its Python: the
// image's files owned as the image says, its whiteouts applied, its
// WORKDIR where code and commands start; its root can write anywhere,
// into a writable layer of its own that no other sandbox and not the
// layers see; and the image's links do not lead init's mounts or writes
// out of the root.
func TestTemplateRoot(t *testing.T) {
	b := newBackend(t)
	root := testutil.TemplateRoot(t)
	hostTmp, _ := os.ReadDir("/var/tmp")
	ctx := context.Background()
	warmTemplate(t, b, root, "")
	sb, err := b.Create(ctx, sandbox.Spec{Root: root, Env: map[string]string{"IMAGE_ENV": "set"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: `
import os, sys
print(os.getcwd())
print(open('/etc/motd').read().strip())
print(os.path.exists('/etc/gone'))
st = os.stat('/srv/app/owned'); print(st.st_uid, os.stat('/usr/bin').st_uid)
print(os.environ['IMAGE_ENV'], os.getuid())
print(os.path.isdir('/tmp') and not os.path.islink('/tmp'), os.path.isdir('/home/user'))
open('/workspace/kept.txt', 'w').write('mine')
print(os.path.exists('/usr/bin/pip'), sys.version_info[0])
`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := "/srv/app\nfrom the template\nFalse\n1000 0\nset 1000\nTrue True\nFalse 3\n"
	if res.Status != sandbox.StatusOK || res.Stdout != want {
		t.Fatalf("got %+v\nwant stdout %q", res, want)
	}
	// Its root writes where the image's root owns; a command starts in
	// the WORKDIR.
	p, err := sb.Start(ctx, sandbox.Command{Argv: []string{"sh", "-c", "echo new > /usr/bin/added && cat /usr/bin/added && pwd"},
		User: sandbox.UserRoot})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(p.Stdout())
	<-p.Done()
	if string(out) != "new\n/srv/app\n" || p.ExitCode() != 0 {
		t.Fatalf("root's command: %q, exit %d", out, p.ExitCode())
	}
	for _, l := range root.Layers {
		if _, err := os.Lstat(filepath.Join(l, "usr/bin/added")); err == nil {
			t.Fatalf("the sandbox's write reached the layer %s", l)
		}
	}
	// Another sandbox of the template sees the image as it is.
	other, err := b.Create(ctx, sandbox.Spec{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	res, err = other.Execute(ctx, sandbox.ExecRequest{Code: "import os; print(os.path.exists('/usr/bin/added'), os.path.exists('/workspace/kept.txt'))"}, nil)
	if err != nil || res.Stdout != "False False\n" {
		t.Fatalf("the other sandbox: %+v %v", res, err)
	}
	after, _ := os.ReadDir("/var/tmp")
	if len(after) > len(hostTmp) {
		var names []string
		for _, e := range after {
			names = append(names, e.Name())
		}
		t.Fatalf("the host's /var/tmp gained entries: %s", strings.Join(names, " "))
	}
}

// A template's USER is its sandboxes' user: their code and commands run
// as it, with its groups and its name; the home is its, and what the file
// API writes as the sandbox user is its. Root stays uid 0.
func TestTemplateUser(t *testing.T) {
	b := newBackend(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		user sandbox.RootUser
		want string
	}{
		{"app", sandbox.RootUser{UID: 1234, GID: 1235, Groups: []uint32{50}, Name: "app"}, "1234 1235 [50] app 1234 x 1234\n"},
		{"root", sandbox.RootUser{UID: 0, GID: 0, Name: "root"}, "0 0 [] root 0 x 0\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := testutil.TemplateRoot(t)
			// A file of the image that only its user may write.
			theirs := filepath.Join(root.Layers[1], "srv/app/theirs")
			if err := os.WriteFile(theirs, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(theirs, int(tc.user.UID), int(tc.user.GID)); err != nil {
				t.Fatal(err)
			}
			root.User = &tc.user
			warmTemplate(t, b, root, "")
			sb, err := b.Create(ctx, sandbox.Spec{Root: root})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: `
import os
open('/srv/app/theirs', 'a').write('x')
print(os.getuid(), os.getgid(), sorted(os.getgroups()), os.environ['USER'], os.stat('/workspace').st_uid,
      open('/srv/app/theirs').read(), os.stat('/srv/app/theirs').st_uid)
`}, nil)
			if err != nil || res.Stdout != tc.want {
				t.Fatalf("code: %+v %v\nwant stdout %q", res, err, tc.want)
			}
			p, err := sb.Start(ctx, sandbox.Command{Argv: []string{"sh", "-c", "id -u; id -G"}})
			if err != nil {
				t.Fatal(err)
			}
			out, _ := io.ReadAll(p.Stdout())
			<-p.Done()
			wantIDs := fmt.Sprintf("%d\n%d", tc.user.UID, tc.user.GID)
			for _, g := range tc.user.Groups {
				wantIDs += fmt.Sprintf(" %d", g)
			}
			if string(out) != wantIDs+"\n" {
				t.Fatalf("a command runs as %q, want %q", out, wantIDs+"\n")
			}
			// Root's commands are root's, without the user's groups.
			p, err = sb.Start(ctx, sandbox.Command{Argv: []string{"id", "-G"}, User: sandbox.UserRoot})
			if err != nil {
				t.Fatal(err)
			}
			out, _ = io.ReadAll(p.Stdout())
			<-p.Done()
			if string(out) != "0\n" {
				t.Fatalf("root's command's groups: %q", out)
			}
			fs, err := sb.(sandbox.FileSystem).Root(sandbox.UserSandbox)
			if err != nil {
				t.Fatal(err)
			}
			if err := fs.WriteFile("tmp/up.txt", strings.NewReader("up"), 10); err != nil {
				t.Fatal(err)
			}
			if err := sb.Workspace().WriteFile("up.txt", strings.NewReader("up"), 10); err != nil {
				t.Fatal(err)
			}
			res, err = sb.Execute(ctx, sandbox.ExecRequest{Code: "import os; print(os.stat('/tmp/up.txt').st_uid, os.stat('/workspace/up.txt').st_uid)"}, nil)
			if want := fmt.Sprintf("%d %[1]d\n", tc.user.UID); err != nil || res.Stdout != want {
				t.Fatalf("an upload is owned by %+v %v, want %q", res, err, want)
			}
		})
	}
}

// A template without python3 runs commands, and code fails saying why;
// with zygotes, its sandboxes start without one (the template's cannot).
func TestTemplateWithoutPython(t *testing.T) {
	b := newBackend(t)
	root := testutil.TemplateRoot(t)
	root.Template = "no-python"
	pythons, _ := filepath.Glob(filepath.Join(root.Layers[0], "usr/bin/python3*"))
	if len(pythons) == 0 {
		t.Fatal("the template's layer has no python3 to take away")
	}
	for _, p := range pythons {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	if testutil.ZygoteMode() {
		if err := b.WarmTemplate(ctx, root, ""); err == nil {
			t.Fatal("a zygote started for a template without python3")
		}
	}
	for i := range 2 {
		sb, err := b.Create(ctx, sandbox.Spec{Root: root})
		if err != nil {
			t.Fatalf("sandbox %d: %v", i, err)
		}
		defer sb.Close()
		p, err := sb.Start(ctx, sandbox.Command{Argv: []string{"sh", "-c", "echo ok; pwd"}})
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(p.Stdout())
		if <-p.Done(); string(out) != "ok\n/srv/app\n" {
			t.Fatalf("sandbox %d: the command said %q", i, out)
		}
		res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "print(1)"}, nil)
		if err != nil || res.Error == nil || !strings.Contains(res.Error.Value, "no python3") {
			t.Fatalf("sandbox %d: code: %+v %v", i, res, err)
		}
	}
	for _, z := range b.Zygotes() {
		if z.Template == root.Template && !z.Retired {
			t.Errorf("a zygote of a template without python3: %+v", z)
		}
	}
}

// An image's code that runs as its interpreter starts (a sitecustomize,
// as an image's site hooks or preloads would) runs confined, in a
// template's zygote as in a sandbox: no_new_privs and the filter are there
// already, and mount and unshare are refused. A sandbox forked from the
// zygote inherits what the hook found; one of its own ran it itself.
func TestTemplateSiteHookConfined(t *testing.T) {
	b := newBackend(t)
	root := testutil.TemplateRoot(t)
	root.Template = "site-hook"
	stdlib, _ := filepath.Glob(filepath.Join(root.Layers[0], "usr/lib/python3.*"))
	if len(stdlib) == 0 {
		t.Fatal("no standard library in the template's layer")
	}
	hook := filepath.Join(root.Layers[1], strings.TrimPrefix(stdlib[0], root.Layers[0]), "sitecustomize.py")
	if err := os.MkdirAll(filepath.Dir(hook), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hook, []byte(`import ctypes, os
_libc = ctypes.CDLL(None, use_errno=True)
_status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
report = {"pid": os.getpid(), "nnp": _status["NoNewPrivs"], "seccomp": _status["Seccomp"]}
for name, call in (("mount", lambda: _libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
                   ("unshare", lambda: _libc.unshare(0x00020000))):
    rc = call()
    report[name] = "refused" if rc != 0 and ctypes.get_errno() == 1 else "rc %d errno %d" % (rc, ctypes.get_errno())
`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	warmTemplate(t, b, root, "")
	sb, err := b.Create(ctx, sandbox.Spec{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: `import os, sitecustomize
r = sitecustomize.report
print(r["nnp"], r["seccomp"], r["mount"], r["unshare"], r["pid"] == os.getpid())`}, nil)
	want := "1 2 refused refused False\n" // ran in the zygote
	if !testutil.ZygoteMode() {
		want = "1 2 refused refused True\n" // ran in the sandbox's own python3
	}
	if err != nil || res.Stdout != want {
		t.Fatalf("the image's site hook: %+v %v, want %q", res, err, want)
	}
}

// A template's zygote serves one tenant: another tenant's sandboxes of
// the same template come from a zygote of their own.
func TestTemplateZygotePerTenant(t *testing.T) {
	if !testutil.ZygoteMode() {
		t.Skip("zygotes only")
	}
	b := newBackend(t)
	root := testutil.TemplateRoot(t)
	root.Template = "per-tenant"
	ctx := context.Background()
	warmTemplate(t, b, root, "alice")
	warmTemplate(t, b, root, "bob")
	for _, tenant := range []string{"alice", "bob", "alice"} {
		sb, err := b.Create(ctx, sandbox.Spec{Root: root, Tenant: tenant})
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Close()
	}
	var forked []int
	for _, z := range b.Zygotes() {
		if z.Template == root.Template {
			forked = append(forked, z.Forked)
		}
	}
	if slices.Sort(forked); !slices.Equal(forked, []int{1, 2}) {
		t.Fatalf("the template's zygotes forked %v sandboxes, want one zygote of 2 (alice) and one of 1 (bob); zygotes: %+v", forked, b.Zygotes())
	}
}

// warmTemplate starts the template's zygote for tenant, in the zygote
// mode's run, so that the sandboxes the test makes are forked from it.
func warmTemplate(t *testing.T, b *native.Backend, root *sandbox.Root, tenant string) {
	t.Helper()
	if !testutil.ZygoteMode() {
		return
	}
	if err := b.WarmTemplate(context.Background(), root, tenant); err != nil {
		t.Fatal(err)
	}
}

// At most ZygoteTemplates templates have a zygote at once: one more
// retires the least recently used, whose sandboxes go on; a sandbox of
// the retired template starts without one, and starts its zygote again,
// which retires the other (closed at once: it has no sandbox).
func TestTemplateZygotesBounded(t *testing.T) {
	if testutil.ZygoteMode() {
		t.Skip("runs once, with its own backend")
	}
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	b, err := native.New(native.Config{CgroupParent: "vivarium-template-lru-test", UIDBase: uidBase, UIDRanges: testutil.UIDRanges,
		Zygote: true, ZygoteTemplates: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	first, second := testutil.TemplateRoot(t), testutil.TemplateRoot(t)
	first.Template, second.Template = "first", "second"
	if err := b.WarmTemplate(ctx, first, ""); err != nil {
		t.Fatal(err)
	}
	kept, err := b.Create(ctx, sandbox.Spec{Root: first})
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Close()
	if err := b.WarmTemplate(ctx, second, ""); err != nil {
		t.Fatal(err)
	}
	state := func() map[string]native.ZygoteStatus {
		out := map[string]native.ZygoteStatus{}
		for _, z := range b.Zygotes() {
			if z.Template != "" {
				out[z.Template] = z
			}
		}
		return out
	}
	if z := state(); !z["first"].Retired || z["first"].Live != 1 || z["second"].Retired {
		t.Fatalf("after a second template's zygote: %+v", z)
	}
	if res, err := kept.Execute(ctx, sandbox.ExecRequest{Code: "print(6 * 7)"}, nil); err != nil || res.Stdout != "42\n" {
		t.Fatalf("the retired zygote's sandbox: %+v %v", res, err)
	}
	again, err := b.Create(ctx, sandbox.Spec{Root: first})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	forked := 0
	for _, z := range b.Zygotes() {
		if z.Template == "first" {
			forked += z.Forked
		}
	}
	if forked != 1 {
		t.Fatalf("a sandbox of the retired template came from a zygote: %+v", b.Zygotes())
	}
	kept.Close()
	testutil.WaitFor(t, 30*time.Second, "the first template's zygote again, the second's gone", func() bool {
		z := state()
		_, second := z["second"]
		return z["first"].Forked == 0 && !z["first"].Retired && z["first"].UID != 0 && !second
	})
}
