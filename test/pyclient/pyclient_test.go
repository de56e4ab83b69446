// Package pyclient_test runs the Python client's unittest suite
// (clients/python/tests) with Debian's python3 against a real `vivarium
// serve`, and checks that the package installs with pip.
package pyclient_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"github.com/vivarium-sandbox/vivarium/test/testserver"
)

const (
	cgroupParent = "vivarium-pyclient-test"
	uidBase      = native.DefaultUIDBase + 7<<24
	python       = "/usr/bin/python3" // Debian's, not whatever is first on PATH
	clientDir    = "../../clients/python"
)

func TestPythonClient(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePythonModules(t, "matplotlib", "pip")
	// A package the server allows, from a wheel built here.
	wheels := t.TempDir()
	testutil.Wheel(t, wheels, "vivpytest", "1.0", map[string]string{"vivpytest/__init__.py": "ANSWER = 42\n"})
	srv := testserver.Start(t, testserver.Build(t), testserver.Options{
		CgroupParent: cgroupParent, UIDBase: uidBase, Keys: []string{"py-a", "py-b"},
		Args: []string{"--package", "vivpytest", "--package-dir", wheels}})

	cmd := exec.Command(python, "-m", "unittest", "discover", "-v", "-s", "tests")
	cmd.Dir = clientDir
	cmd.Env = append(os.Environ(), "PYTHONPATH=.", "PYTHONDONTWRITEBYTECODE=1",
		"VIVARIUM_URL="+srv.URL, "VIVARIUM_API_KEY="+srv.Keys[0], "VIVARIUM_API_KEY_2="+srv.Keys[1],
		"VIVARIUM_TEST_PACKAGE=vivpytest")
	if _, err := criu.Usable(); err == nil {
		// The server's default sandboxes, from the zygote, pause.
		cmd.Env = append(cmd.Env, "VIVARIUM_PAUSE=1")
	}
	out, err := cmd.CombinedOutput()
	t.Logf("python3 -m unittest:\n%s", out)
	if err != nil {
		t.Fatalf("unittest: %v", err)
	}
	// Skips are fine only for what this machine lacks (langchain-core),
	// never for the server-backed tests.
	if strings.Contains(string(out), "needs a server") {
		t.Fatal("server-backed tests were skipped")
	}
}

// The client pauses and resumes a sandbox on a server without a zygote
// (classic sandboxes, CRIU): test_pause's round trip there too.
func TestPythonClientPause(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := criu.Usable(); err != nil {
		t.Skipf("pausing needs CRIU, not built here (make criu): %v", err)
	}
	srv := testserver.Start(t, testserver.Build(t), testserver.Options{
		CgroupParent: cgroupParent + "-pause", UIDBase: uidBase + testutil.UIDSpan, Keys: []string{"py-pause"},
		Args: []string{"--zygote=false"}})
	cmd := exec.Command(python, "-m", "unittest", "-v", "-k", "test_pause", "tests.test_client")
	cmd.Dir = clientDir
	cmd.Env = append(os.Environ(), "PYTHONPATH=.", "PYTHONDONTWRITEBYTECODE=1",
		"VIVARIUM_URL="+srv.URL, "VIVARIUM_API_KEY="+srv.Keys[0], "VIVARIUM_PAUSE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("python3 -m unittest:\n%s", out)
	if err != nil || !strings.Contains(string(out), "Ran 1 test") {
		t.Fatalf("unittest: %v", err)
	}
	if n := strings.Count(srv.Log(), "sandbox paused"); n != 2 {
		t.Errorf("the server paused %d sandboxes, want 2", n)
	}
}

// pip install ./clients/python works, offline, and gives an importable
// package.
func TestPipInstall(t *testing.T) {
	testutil.RequirePythonModules(t, "pip", "setuptools")
	// A copy: an in-tree build would leave build/ and *.egg-info behind.
	src := filepath.Join(t.TempDir(), "src")
	if out, err := exec.Command("cp", "-r", clientDir, src).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	target := filepath.Join(t.TempDir(), "site")
	cmd := exec.Command(python, "-m", "pip", "install", "--quiet", "--no-index", "--no-build-isolation", "--no-deps",
		"--disable-pip-version-check", "--target", target, src)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pip install: %v\n%s", err, out)
	}
	cmd = exec.Command(python, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); import vivarium, vivarium.langchain; print(vivarium.__version__, vivarium.Client().url)", target)
	cmd.Env = []string{"VIVARIUM_URL=http://example.invalid:1"}
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "0.1.0 http://example.invalid:1" {
		t.Fatalf("import the installed package: %v %s", err, out)
	}
}
