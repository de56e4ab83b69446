package gvisor_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

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
