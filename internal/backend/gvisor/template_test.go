package gvisor_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// A template's sandbox on gVisor: its root is the template's layers,
// read-only, the links the image puts where the bundle mounts
// (/tmp to the host's /var/tmp, /home to /) neutralised; its code runs in
// the template's python3; Close leaves no mount of it.
func TestTemplateRoot(t *testing.T) {
	dir := t.TempDir()
	b := newBackend(t, "vivarium-gvisor-template-test", dir)
	root := testutil.TemplateRoot(t)
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{Root: root, Env: map[string]string{"PATH": "/usr/bin:/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: `import os, sys
print(sys.executable, open('/etc/motd').read().strip(), os.path.exists('/etc/gone'))
open('/tmp/t', 'w').write('x'); print(os.path.islink('/tmp'), os.listdir('/tmp'))
try:
    open('/usr/bin/evil', 'w')
except OSError as e:
    print(type(e).__name__)
`}, nil)
	want := "/usr/bin/python3 from the template False\nFalse ['t']\nPermissionError\n"
	if err != nil || res.Stdout != want {
		t.Fatalf("%+v %v\nwant %q", res, err, want)
	}
	if _, err := os.Stat(filepath.Join(root.Layers[1], "tmp", "t")); err == nil {
		t.Error("the sandbox's write reached the template's layer")
	}
	sb.Close()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "template-*")); len(m) > 0 {
		t.Errorf("left behind: %v", m)
	}
}

// A template without python3 on gVisor has a runner all the same (the
// agent's program again): code gets an error that says why, commands run.
func TestTemplateWithoutPython(t *testing.T) {
	b := newBackend(t, "vivarium-gvisor-nopython-test", t.TempDir())
	defer b.Close()
	real, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		t.Fatal(err)
	}
	root := templateWith(t, "sha256:nopython", func(usrBin string) error {
		for _, name := range []string{"python3", filepath.Base(real)} {
			// Whiteouts, as an image's layer that removed them.
			if err := unix.Mknod(filepath.Join(usrBin, name), unix.S_IFCHR, 0); err != nil {
				return err
			}
		}
		return nil
	})
	ctx := context.Background()
	for _, oneShot := range []bool{false, true} {
		sb, err := b.Create(ctx, sandbox.Spec{Root: root, OneShot: oneShot, Env: map[string]string{"PATH": "/usr/bin:/bin"}})
		if err != nil {
			t.Fatal(err)
		}
		res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "print(1)"}, nil)
		if err != nil || res.Error == nil || !strings.Contains(res.Error.Value, "no python3") || res.Stdout != "" {
			t.Fatalf("code in a template without python3 (one-shot %v): %+v %v", oneShot, res, err)
		}
		if !oneShot {
			p, err := sb.Start(ctx, sandbox.Command{Argv: []string{"sh", "-c", "echo $((6 * 7)); command -v python3 || echo none"}})
			if err != nil {
				t.Fatal(err)
			}
			out, _ := io.ReadAll(p.Stdout())
			if <-p.Done(); string(out) != "42\nnone\n" || p.ExitCode() != 0 {
				t.Errorf("a command: %q, exit %d", out, p.ExitCode())
			}
		}
		sb.Close()
	}
}

// A template whose python3 exits at once fails its sandbox's start-up
// as soon as it exits, saying so, not after the setup's time limit.
func TestTemplateBrokenPython(t *testing.T) {
	b := newBackend(t, "vivarium-gvisor-brokenpy-test", t.TempDir())
	defer b.Close()
	root := templateWith(t, "sha256:brokenpy", func(usrBin string) error {
		return os.WriteFile(filepath.Join(usrBin, "python3"), []byte("#!/bin/sh\nexit 3\n"), 0o755)
	})
	sb, err := b.Create(context.Background(), sandbox.Spec{Root: root, Env: map[string]string{"PATH": "/usr/bin:/bin"}})
	if err == nil {
		sb.Close()
		t.Fatal("a sandbox whose runner cannot start was made")
	}
	if !strings.Contains(err.Error(), "exited during start-up with status 3") {
		t.Errorf("got %v, want the runner's exit during start-up", err)
	}
}

// templateWith is testutil.TemplateRoot under one more layer, whose
// usr/bin fill makes, named id.
func templateWith(t *testing.T, id string, fill func(usrBin string) error) *sandbox.Root {
	t.Helper()
	root := testutil.TemplateRoot(t)
	top := t.TempDir()
	usrBin := filepath.Join(top, "usr/bin")
	if err := os.MkdirAll(usrBin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := fill(usrBin); err != nil {
		t.Fatal(err)
	}
	root.Layers, root.ID = append(root.Layers, top), id
	return root
}

// A template's USER on gVisor: its code and commands run as it, with its
// groups, and uploads are its; a USER of root is refused (root's
// commands are not offered on gVisor).
func TestTemplateUser(t *testing.T) {
	b := newBackend(t, "vivarium-gvisor-user-test", t.TempDir())
	defer b.Close()
	ctx := context.Background()
	root := testutil.TemplateRoot(t)
	root.User = &sandbox.RootUser{UID: 1234, GID: 1235, Groups: []uint32{50}, Name: "app"}
	sb, err := b.Create(ctx, sandbox.Spec{Root: root, Env: map[string]string{"PATH": "/usr/bin:/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if err := sb.Workspace().WriteFile("up.txt", strings.NewReader("up"), 10); err != nil {
		t.Fatal(err)
	}
	res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: `import os
print(os.getuid(), os.getgid(), os.getgroups(), os.stat('/workspace/up.txt').st_uid)`}, nil)
	if want := "1234 1235 [50] 1234\n"; err != nil || res.Stdout != want {
		t.Fatalf("%+v %v\nwant %q", res, err, want)
	}
	p, err := sb.Start(ctx, sandbox.Command{Argv: []string{"id", "-u"}})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(p.Stdout())
	if <-p.Done(); string(out) != "1234\n" {
		t.Fatalf("a command runs as %q", out)
	}
	root.User = &sandbox.RootUser{UID: 0, GID: 0, Name: "root"}
	if sb, err := b.Create(ctx, sandbox.Spec{Root: root}); !errors.Is(err, sandbox.ErrUnsupported) {
		if err == nil {
			sb.Close()
		}
		t.Fatalf("a template of USER root: %v, want ErrUnsupported", err)
	}
}
