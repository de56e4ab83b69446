package native_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
