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

// A template's sandbox on a backend with zygotes is forked from the
// template's own zygote (its python3), and is complete: it pauses and
// resumes twice with its state and its writes to the template's files,
// forks into copies that go their own ways, and is kept on disk and
// opened from there; its runner is confined by Landlock again after
// every restore.
func TestTemplateZygotePause(t *testing.T) {
	ctx := context.Background()
	b := zygotePauseBackend(t)
	b.criuBin = requireCRIU(t)
	root := testutil.TemplateRoot(t)
	root.User = &sandbox.RootUser{UID: 1234, GID: 1234, Groups: []uint32{50}, Name: "app"}
	if err := b.WarmTemplate(ctx, root, ""); err != nil {
		t.Fatal(err)
	}
	sbx, err := b.Create(ctx, sandbox.Spec{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	defer sbx.Close()
	s := sbx.(*Sandbox)
	var mine *ZygoteStatus
	for _, z := range b.Zygotes() {
		if z.Template == root.Template {
			mine = &z
		}
	}
	if mine == nil || mine.Forked != 1 || mine.Live != 1 {
		t.Fatalf("no zygote of the template's served the sandbox: %+v", b.Zygotes())
	}
	if got := execText(t, s, "import os, sys\nx = 41\n(os.getcwd(), os.getuid(), os.getgroups(), sys.executable)"); got != "('/srv/app', 1234, [50], '/usr/bin/python3')" {
		t.Fatalf("the template's sandbox: %s", got)
	}
	cmd, err := s.Start(ctx, sandbox.Command{Argv: []string{"sh", "-c", "printf kept > /usr/bin/mine"}, User: sandbox.UserRoot})
	if err != nil {
		t.Fatal(err)
	}
	if <-cmd.Done(); cmd.ExitCode() != 0 {
		t.Fatalf("root's command: exit %d", cmd.ExitCode())
	}
	oneLandlockDomain(t, s, "before a pause")
	for round := 1; round <= 2; round++ {
		if err := s.Pause(ctx); err != nil {
			t.Fatalf("pause %d: %v", round, err)
		}
		if err := s.Resume(ctx); err != nil {
			t.Fatalf("resume %d: %v", round, err)
		}
		if got := execText(t, s, "x += 1\n(x, open('/usr/bin/mine').read(), __import__('os').getuid())"); got != fmt.Sprintf("(%d, 'kept', 1234)", 41+round) {
			t.Fatalf("after resume %d: %s", round, got)
		}
		oneLandlockDomain(t, s, fmt.Sprintf("after resume %d", round))
	}
	copies, err := s.Fork(ctx, 2, sandbox.ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range copies {
		defer c.Close()
		if err := c.Workspace().WriteFile("up.txt", strings.NewReader("up"), 10); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("(%d, 'kept', 'up', 1234)", 44+i)
		if got := execText(t, c.(*Sandbox), fmt.Sprintf("x += %d\n(x, open('/usr/bin/mine').read(), open('/workspace/up.txt').read(), __import__('os').getuid())", i+1)); got != want {
			t.Fatalf("copy %d: %s, want %s", i, got, want)
		}
		oneLandlockDomain(t, c.(*Sandbox), fmt.Sprintf("copy %d", i))
	}
	for _, c := range copies {
		c.Close() // their host users, for the one opened below
	}
	// Kept on disk and opened from there, as another server would.
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	kept := filepath.Join(t.TempDir(), "kept")
	if _, err := s.PersistPaused(ctx, kept); err != nil {
		t.Fatal(err)
	}
	o := openResumed(t, b, kept, sandbox.FromSnapshot{})
	if got := execText(t, o, "(x, open('/usr/bin/mine').read())"); got != "(43, 'kept')" {
		t.Fatalf("opened from disk: %s", got)
	}
	oneLandlockDomain(t, o, "opened from disk")
}
