package native

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// A template's sandbox pauses and resumes with its state, its own writes
// to the template's files and the template's files as they were.
func TestTemplateRootPause(t *testing.T) {
	bin := requireCRIU(t)
	b := pauseBackend(t, pauseCgroupParent, pauseUIDBase)
	b.criuBin = bin
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{Root: testutil.TemplateRoot(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "x = 41"}, nil); err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("%+v %v", res, err)
	}
	cmd, err := sb.Start(ctx, sandbox.Command{Argv: []string{"sh", "-c", "printf kept > /usr/bin/mine"}, User: sandbox.UserRoot})
	if err != nil {
		t.Fatal(err)
	}
	if <-cmd.Done(); cmd.ExitCode() != 0 {
		t.Fatalf("write as root: exit %d", cmd.ExitCode())
	}
	p := sb.(sandbox.Pauser)
	if err := p.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "print(x + 1, open('/usr/bin/mine').read(), open('/etc/motd').read().strip())"}, nil)
	if err != nil || res.Stdout != "42 kept from the template\n" {
		t.Fatalf("after resume: %+v %v", res, err)
	}
}

// A template's sandbox is not forked, saved or kept on disk yet, and says
// so.
func TestTemplateRootNotForked(t *testing.T) {
	requireCRIU(t)
	b := pauseBackend(t, pauseCgroupParent, pauseUIDBase)
	sb, err := b.Create(context.Background(), sandbox.Spec{Root: testutil.TemplateRoot(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	s := sb.(*Sandbox)
	for what, err := range map[string]error{"fork": s.ForkSupported(), "snapshot": s.SnapshotSupported()} {
		if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "template") {
			t.Errorf("%s: %v", what, err)
		}
	}
}
