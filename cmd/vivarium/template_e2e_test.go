package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// standinRegistry starts the repository's registry (scripts/registry.sh)
// seeded with its stand-in images and returns its address. It skips the
// test when the stand-ins are not built, and fails instead when
// VIVARIUM_REQUIRE_STANDINS=1 (as scripts/test.sh sets once it has built
// them).
func standinRegistry(t *testing.T) string {
	t.Helper()
	script := filepath.Join(moduleRoot(t), "scripts", "registry.sh")
	if out, err := exec.Command(script, "built").CombinedOutput(); err != nil {
		msg := strings.TrimSpace(string(out))
		if os.Getenv("VIVARIUM_REQUIRE_STANDINS") == "1" {
			t.Fatalf("%s (VIVARIUM_REQUIRE_STANDINS=1)", msg)
		}
		t.Skipf("%s; set VIVARIUM_REQUIRE_STANDINS=1 to fail instead", msg)
	}
	dir := t.TempDir()
	// Registered after t.TempDir, so run before it removes the storage
	// (stop returns once the registry has exited), and before start, which
	// may fail with the registry running.
	t.Cleanup(func() {
		if err := exec.Command(script, "stop", dir).Run(); err != nil {
			t.Errorf("scripts/registry.sh stop: %v", err)
		}
	})
	cmd := exec.Command(script, "start", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/registry.sh start: %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// A user's path to a template of their own: python:3.13 (the stand-in:
// Debian trixie's CPython 3.13, not the host's 3.11) pulled from the
// repository's registry through a mirror, a Dockerfile that pip-installs
// a package and its dependency from a directory of wheels (no index, no
// network), its ENV and WORKDIR; a sandbox of it runs that Python with
// the package, and a second build is all cached.
func TestTemplateStandinWheels(t *testing.T) {
	needSandbox(t)
	addr := standinRegistry(t)
	dataDir := t.TempDir()
	r := vivarium(t, "", "image", "pull", "--data-dir", dataDir,
		"--registry-mirror", "docker.io="+addr, "--insecure-registry", addr, "python:3.13")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "index.docker.io/library/python:3.13 sha256:") {
		t.Fatalf("image pull python:3.13: %+v", r)
	}
	if r = vivarium(t, "", "template", "inspect", "--data-dir", dataDir, "python:3.13"); !strings.Contains(r.stdout, "stand-in: Debian trixie") {
		t.Errorf("python:3.13 is not labelled as trixie's stand-in: %+v", r)
	}

	dir := t.TempDir()
	wheels := filepath.Join(dir, "wheels")
	if err := os.Mkdir(wheels, 0o755); err != nil {
		t.Fatal(err)
	}
	testutil.Wheel(t, wheels, "shout", "0.2", map[string]string{
		"shout.py": "def loud(s):\n    return s.upper() + '!'\n",
	})
	testutil.Wheel(t, wheels, "greeter", "1.0", map[string]string{
		"greeter/__init__.py": "import shout\n\ndef greet(name):\n    return shout.loud('hello ' + name)\n",
	}, "shout>=0.2")
	dockerfile := `FROM python:3.13
COPY wheels/ /wheels/
RUN pip install --no-index --find-links /wheels --break-system-packages greeter
ENV GREETEE=vivarium
WORKDIR /srv/app
`
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	build := func() cli {
		t.Helper()
		return vivarium(t, "", "template", "build", "--data-dir", dataDir, "-t", "greeter:1", dir)
	}
	if r = build(); r.code != 0 {
		t.Fatalf("template build: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = vivarium(t, "", "run", "--data-dir", dataDir, "--template", "greeter:1", "-c", `import os, sys, greeter
print(sys.version_info[:2], sys.executable)
print(greeter.greet(os.environ["GREETEE"]), greeter.__file__)
print(os.getcwd())`)
	want := "(3, 13) /usr/bin/python3\nHELLO VIVARIUM! /usr/local/lib/python3.13/dist-packages/greeter/__init__.py\n/srv/app\n"
	if r.code != 0 || r.stdout != want {
		t.Fatalf("a sandbox of the template: exit %d\n%q\nwant %q\n%s", r.code, r.stdout, want, r.stderr)
	}
	r = build()
	if steps := strings.Count(r.stderr, "step "); r.code != 0 || steps != 4 || strings.Count(r.stderr, "\ncached\n") != steps {
		t.Fatalf("a rebuild: exit %d, want its 4 steps cached\n%s", r.code, r.stderr)
	}
}
