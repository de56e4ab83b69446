package native_test

import (
	"context"
	"io"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// "python" is a command, as in an E2B sandbox, whether or not the host has
// one: a sandbox's PATH ends with the shims (the package's second pass
// runs this in sandboxes forked from a zygote, whose runner directory is
// the zygote's).
func TestPythonCommand(t *testing.T) {
	t.Parallel()
	sb, err := newBackend(t).Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	for argv, want := range map[string][]string{
		"python -c 'print(6 * 7)'": {"42\n"},
		// The host's own python comes first where it has one.
		"command -v python": {"/usr/bin/python\n", sandbox.ShimDir + "/python\n"},
	} {
		p, err := sb.Start(context.Background(), sandbox.Command{Argv: []string{"sh", "-c", argv}})
		if err != nil {
			t.Fatalf("%s: %v", argv, err)
		}
		p.Stdin().Close()
		out, _ := io.ReadAll(p.Stdout())
		errOut, _ := io.ReadAll(p.Stderr())
		<-p.Done()
		if p.ExitCode() != 0 || (string(out) != want[0] && (len(want) < 2 || string(out) != want[1])) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", argv, p.ExitCode(), out, errOut)
		}
	}
	// Run directly, not through a shell: the command is looked up in PATH.
	p, err := sb.Start(context.Background(), sandbox.Command{Argv: []string{"python", "-c", "import sys; print(sys.version_info[0])"}})
	if err != nil {
		t.Fatal(err)
	}
	p.Stdin().Close()
	if out, _ := io.ReadAll(p.Stdout()); string(out) != "3\n" {
		t.Errorf("python run directly: %q", out)
	}
	<-p.Done()
}
