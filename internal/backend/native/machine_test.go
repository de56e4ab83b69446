package native_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// command runs argv in sb as user and returns its output and exit code.
func command(t *testing.T, sb sandbox.Sandbox, user string, argv ...string) (string, int) {
	t.Helper()
	p, err := sb.Start(context.Background(), sandbox.Command{Argv: argv, User: user})
	if err != nil {
		t.Fatalf("%v: %v", argv, err)
	}
	p.Stdin().Close()
	out, _ := io.ReadAll(p.Stdout())
	errOut, _ := io.ReadAll(p.Stderr())
	return string(out) + string(errOut), p.ExitCode()
}

// A sandbox is a small machine of its own: a writable root, within its
// disk limit, whose system directories its root owns, and a root without
// any capability.
func TestRootIsASmallMachine(t *testing.T) {
	t.Parallel()
	sb, err := newBackend(t).Create(context.Background(), sandbox.Spec{Limits: sandbox.Limits{Disk: 8 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()

	out, _ := command(t, sb, sandbox.UserRoot, "sh", "-c",
		"id -u; echo motd > /etc/motd && cat /etc/motd; mkdir -p /srv/app /usr/local/x 2>&1; "+
			"echo x > /opt/vivarium/x;  grep CapEff /proc/self/status; cat /etc/passwd | head -2; pwd")
	want := []string{"0\n", "motd\n", "/usr/local/x", "Read-only file system", "CapEff:\t0000000000000000\n",
		"root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000:sandbox:/workspace:/bin/sh\n", "/workspace\n"}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("as root: %q lacks %q", out, w)
		}
	}
	if out, _ := command(t, sb, sandbox.UserRoot, "ls", "-d", "/srv/app"); out != "/srv/app\n" {
		t.Errorf("root's directory /srv/app: %q", out)
	}

	// The sandbox user: its home and /tmp, not the system's directories.
	res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: `
import os
def attempt(what, f):
    try:
        f()
        print(what, "ok")
    except OSError as e:
        print(what, type(e).__name__)
attempt("write /etc", lambda: open("/etc/evil", "w"))
attempt("write /srv/app", lambda: open("/srv/app/x", "w"))
attempt("write /tmp", lambda: open("/tmp/mine", "w").write("x"))
attempt("mkdir /newdir", lambda: os.mkdir("/newdir"))
print(os.getcwd(), os.path.samefile("/workspace", "/home/user"))
`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantOut := "write /etc PermissionError\nwrite /srv/app PermissionError\nwrite /tmp ok\nmkdir /newdir PermissionError\n" +
		"/workspace True\n"
	if res.Stdout != wantOut {
		t.Errorf("as the sandbox user:\n%s%s\nwant:\n%s", res.Stdout, res.Stderr, wantOut)
	}

	// Whatever is written anywhere counts against the one disk limit.
	out, code := command(t, sb, sandbox.UserRoot, "sh", "-c", "head -c 16M /dev/zero > /etc/big")
	if code == 0 || !strings.Contains(out, "No space left on device") {
		t.Errorf("16 MiB into /etc of an 8 MiB sandbox: exit %d, %q", code, out)
	}

	if _, err := sb.Start(context.Background(), sandbox.Command{Argv: []string{"true"}, User: "admin"}); !errors.Is(err, sandbox.ErrInvalidSpec) {
		t.Errorf("a command as an unknown user: %v", err)
	}
}

// E2B's layout: the user is "user", at home in /home/user, the same
// directory as the workspace.
func TestHomeUser(t *testing.T) {
	t.Parallel()
	sb, err := newBackend(t).Create(context.Background(), sandbox.Spec{Home: sandbox.HomeUser})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: `
import os, pwd
open("note.txt", "w").write("hi")
print(os.getcwd(), pwd.getpwuid(os.getuid()).pw_name, pwd.getpwuid(os.getuid()).pw_dir, os.environ["HOME"], os.environ["USER"])
`}, nil)
	if err != nil || res.Stdout != "/home/user user /home/user /home/user user\n" {
		t.Fatalf("%+v %v", res, err)
	}
	f, _, err := sb.Workspace().OpenFile("note.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if b, _ := io.ReadAll(f); string(b) != "hi" {
		t.Fatalf("the workspace's note.txt: %q", b)
	}
	if out, _ := command(t, sb, "", "sh", "-c", "pwd; whoami; echo $HOME $USER"); out != "/home/user\nuser\n/home/user user\n" {
		t.Fatalf("a command: %q", out)
	}
	if out, _ := command(t, sb, sandbox.UserRoot, "sh", "-c", "whoami; echo $HOME $USER; ls -A /root"); out != "root\n/root root\n" {
		t.Fatalf("a command as root: %q", out)
	}
}

// The host reaches the sandbox's whole disk, as its user or its root
// would write it, and nothing past it: no link is followed, no mount
// crossed (/proc, /usr, /dev and the binds stay out of reach).
func TestFileSystemBeyondTheWorkspace(t *testing.T) {
	t.Parallel()
	sb, err := newBackend(t).Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	fs := sb.(sandbox.FileSystem)
	asUser, err := fs.Root(sandbox.UserSandbox)
	if err != nil {
		t.Fatal(err)
	}
	asRoot, err := fs.Root(sandbox.UserRoot)
	if err != nil {
		t.Fatal(err)
	}
	if err := asUser.WriteFile("tmp/from-host", strings.NewReader("u"), 10); err != nil {
		t.Fatal(err)
	}
	if err := asRoot.WriteFile("etc/from-host", strings.NewReader("r"), 10); err != nil {
		t.Fatal(err)
	}
	out, _ := command(t, sb, "", "sh", "-c", "stat -c '%u %n' /tmp/from-host /etc/from-host; cat /tmp/from-host /etc/from-host; "+
		"ln -s /etc/passwd /tmp/link; ln -s /proc/1/environ /tmp/proclink")
	if out != "1000 /tmp/from-host\n0 /etc/from-host\nur" {
		t.Fatalf("in the sandbox: %q", out)
	}
	for _, name := range []string{"proc/self/status", "proc/1/environ", "usr/bin/python3", "dev/null", "tmp/link",
		"tmp/proclink", "home/user", "opt/vivarium/runner.py"} {
		if f, _, err := asRoot.OpenFile(name); err == nil {
			f.Close()
			t.Errorf("the host opened /%s of the sandbox", name)
		}
	}
	if _, err := fs.Root("admin"); !errors.Is(err, sandbox.ErrInvalidSpec) {
		t.Errorf("Root(admin): %v", err)
	}
}
