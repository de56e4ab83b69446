package native

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// A template's sandbox pauses and resumes with its state, its own writes
// to the template's files and the template's files as they were.
func TestTemplateRootPause(t *testing.T) {
	_, sb := templateSandboxToKeep(t, "printf kept > /usr/bin/mine")
	ctx := context.Background()
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "print(x + 1, open('/usr/bin/mine').read(), open('/etc/motd').read().strip())"}, nil)
	if err != nil || res.Stdout != "42 kept from the template\n" {
		t.Fatalf("after resume: %+v %v", res, err)
	}
}

// A template's sandbox forks: each copy has its state, the source's own
// writes to the template's files (owned as the source's were, by the
// copy's own ids), the template's files and whiteouts, files uploaded to
// it, and goes its own way.
func TestTemplateRootFork(t *testing.T) {
	b, s := templateSandboxToKeep(t, "printf kept > /usr/bin/mine && rm /etc/motd")
	ctx := context.Background()
	copies, err := s.Fork(ctx, 2, sandbox.ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range copies {
		defer c.Close()
		// An upload reaches the root the copy's code sees.
		if err := c.Workspace().WriteFile("up.txt", strings.NewReader("up"), 10); err != nil {
			t.Fatal(err)
		}
		code := fmt.Sprintf(`import os
x += %d
st = os.stat('/usr/bin/mine')
print(x, open('/usr/bin/mine').read(), st.st_uid, os.path.exists('/etc/motd'), os.path.exists('/etc/gone'), os.path.exists('/usr/bin/python3'), open('/workspace/up.txt').read())`, i+1)
		res, err := c.Execute(ctx, sandbox.ExecRequest{Code: code}, nil)
		if want := fmt.Sprintf("%d kept 0 False False True up\n", 42+i); err != nil || res.Stdout != want {
			t.Fatalf("copy %d: %+v %v, want %q", i, res, err, want)
		}
	}
	if res, err := s.Execute(ctx, sandbox.ExecRequest{Code: "print(x)"}, nil); err != nil || res.Stdout != "41\n" {
		t.Fatalf("the source after its copies: %+v %v", res, err)
	}
	// Paused, kept on disk and let go of, resumed from there; and opened
	// from disk as another server would.
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	kept, again := filepath.Join(t.TempDir(), "kept"), filepath.Join(t.TempDir(), "again")
	if _, err := s.PersistPaused(ctx, kept); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PersistPaused(ctx, again); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleasePaused(kept); err != nil {
		t.Fatal(err)
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	o := openResumed(t, b, again, sandbox.FromSnapshot{})
	for what, sb := range map[string]*Sandbox{"resumed from disk": s, "opened from disk": o} {
		res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "print(x, open('/usr/bin/mine').read(), open('/etc/passwd').read().count('img:x'))"}, nil)
		if err != nil || res.Stdout != "41 kept 1\n" {
			t.Errorf("%s: %+v %v", what, res, err)
		}
	}
}

// A copy of a sandbox of a template with a USER runs as that user, and
// what the file API writes in it is that user's, by the copy's own ids.
func TestTemplateUserFork(t *testing.T) {
	bin := requireCRIU(t)
	b := pauseBackend(t, pauseCgroupParent, pauseUIDBase)
	b.criuBin = bin
	ctx := context.Background()
	root := testutil.TemplateRoot(t)
	root.User = &sandbox.RootUser{UID: 1234, GID: 1234, Name: "app"}
	sb, err := b.Create(ctx, sandbox.Spec{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "x = 41"}, nil); err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("%+v %v", res, err)
	}
	copies, err := sb.(*Sandbox).Fork(ctx, 1, sandbox.ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := copies[0]
	defer c.Close()
	if err := c.Workspace().WriteFile("up.txt", strings.NewReader("up"), 10); err != nil {
		t.Fatal(err)
	}
	res, err := c.Execute(ctx, sandbox.ExecRequest{Code: "import os; print(x, os.getuid(), os.stat('/workspace/up.txt').st_uid)"}, nil)
	if err != nil || res.Stdout != "41 1234 1234\n" {
		t.Fatalf("the copy: %+v %v", res, err)
	}
}

// templateSandboxToKeep is a sandbox of testutil.TemplateRoot on a backend
// that pauses, closed when the test ends, whose Python holds x = 41 and
// whose root has run root's command.
func templateSandboxToKeep(t *testing.T, root string) (*Backend, *Sandbox) {
	t.Helper()
	bin := requireCRIU(t)
	b := pauseBackend(t, pauseCgroupParent, pauseUIDBase)
	b.criuBin = bin
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{Root: testutil.TemplateRoot(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	if res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "x = 41"}, nil); err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("%+v %v", res, err)
	}
	cmd, err := sb.Start(ctx, sandbox.Command{Argv: []string{"sh", "-c", root}, User: sandbox.UserRoot})
	if err != nil {
		t.Fatal(err)
	}
	if <-cmd.Done(); cmd.ExitCode() != 0 {
		t.Fatalf("%s as root: exit %d", root, cmd.ExitCode())
	}
	return b, sb.(*Sandbox)
}
