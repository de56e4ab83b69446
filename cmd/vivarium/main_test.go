package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// The test binary doubles as the vivarium binary: re-executed with
// VIVARIUM_TEST_MAIN set it runs main, and as a sandbox's init it is init.
func TestMain(m *testing.M) {
	if native.IsInit() {
		native.RunInit()
	}
	if os.Getenv("VIVARIUM_TEST_MAIN") == "1" {
		os.Unsetenv("VIVARIUM_TEST_MAIN")
		main()
	}
	code := m.Run()
	if err := testutil.StopDockerd(); err != nil {
		fmt.Fprintln(os.Stderr, "stop the test dockerd:", err)
		code = 1
	}
	os.Exit(code)
}

type cli struct {
	stdout, stderr string
	code           int
}

func vivarium(t *testing.T, stdin string, args ...string) cli {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "VIVARIUM_TEST_MAIN=1")
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return cli{out.String(), errb.String(), code}
}

func needSandbox(t testing.TB) {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
}

func TestRunPlain(t *testing.T) {
	needSandbox(t)
	t.Parallel()
	for _, tc := range []struct {
		name           string
		args           []string
		stdin          string
		stdout, stderr string
		code           int
	}{
		{"print", []string{"run", "-c", "print('hello')"}, "", "hello\n", "", 0},
		{"stdin", []string{"run", "-"}, "import sys\nprint(2 + 2)\nsys.exit(5)", "4\n", "", 5},
		{"stderr", []string{"run", "-c", "import sys; print('e', file=sys.stderr)"}, "", "", "e\n", 0},
		{"exception", []string{"run", "-c", "raise ValueError('bad')"}, "", "", "ValueError: bad", 1},
		{"timeout", []string{"run", "--timeout", "500ms", "-c", "while True: pass"}, "", "", "timeout", 124},
		{"memory", []string{"run", "--memory", "64MiB", "-c", "b = bytearray(1 << 30)"}, "", "", "memory", 137},
		{"env", []string{"run", "--env", "A=1", "--env", "B=x=y", "-c", "import os; print(os.environ['A'], os.environ['B'])"}, "", "1 x=y\n", "", 0},
		{"flags after code", []string{"run", "-c", "print(1)", "--timeout", "5s"}, "", "1\n", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := vivarium(t, tc.stdin, tc.args...)
			if got.code != tc.code || got.stdout != tc.stdout || !strings.Contains(got.stderr, tc.stderr) {
				t.Fatalf("got exit %d stdout %q stderr %q; want exit %d stdout %q stderr containing %q",
					got.code, got.stdout, got.stderr, tc.code, tc.stdout, tc.stderr)
			}
		})
	}
}

func TestRunJSON(t *testing.T) {
	needSandbox(t)
	t.Parallel()
	dir := t.TempDir()
	data := filepath.Join(dir, "numbers.txt")
	if err := os.WriteFile(data, []byte("1\n2\n3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "job.py")
	if err := os.WriteFile(script, []byte(`
nums = [int(x) for x in open("in/n.txt")]
open("total.txt", "w").write(str(sum(nums)))
print("summed", len(nums))
sum(nums)
`), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	got := vivarium(t, "", "run", "--json", "--file", data+":in/n.txt", "--out", out, script)
	if got.code != 0 {
		t.Fatalf("exit %d, stderr %s", got.code, got.stderr)
	}
	var res sandbox.Result
	dec := json.NewDecoder(strings.NewReader(got.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&res); err != nil {
		t.Fatalf("stdout is not one Result: %v\n%s", err, got.stdout)
	}
	if dec.More() {
		t.Fatalf("more than one JSON value on stdout: %s", got.stdout)
	}
	if res.Status != sandbox.StatusOK || res.Stdout != "summed 3\n" || len(res.Results) != 1 || res.Results[0].Text != "6" || !res.Results[0].IsMainResult {
		t.Fatalf("result: %+v", res)
	}
	if len(res.Files) != 2 || res.Files[0].Path != "in/n.txt" || res.Files[1].Path != "total.txt" {
		t.Fatalf("files: %+v", res.Files)
	}
	if b, err := os.ReadFile(filepath.Join(out, "total.txt")); err != nil || string(b) != "6" {
		t.Fatalf("--out: %q %v", b, err)
	}
}

func TestRunJSONErrorShapes(t *testing.T) {
	needSandbox(t)
	t.Parallel()
	got := vivarium(t, "", "run", "--json", "--timeout", "300ms", "-c", "import time; time.sleep(10)")
	var res map[string]any
	if err := json.Unmarshal([]byte(got.stdout), &res); err != nil {
		t.Fatalf("%v: %q", err, got.stdout)
	}
	if res["status"] != "timeout" || res["exit_code"] != float64(124) || got.code != 124 {
		t.Fatalf("%v (exit %d)", res, got.code)
	}
	for _, k := range []string{"stdout", "stderr", "stdout_truncated", "stderr_truncated", "results", "error",
		"duration_ms", "cpu_ms", "peak_memory_bytes", "files"} {
		if _, ok := res[k]; !ok {
			t.Errorf("field %q missing", k)
		}
	}
}

func TestRunBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run"}, "nothing to run"},
		{[]string{"run", "-c", "1", "file.py"}, "either -c CODE or a file"},
		{[]string{"run", "/nonexistent/x.py"}, "no such file"},
		{[]string{"run", "--memory", "lots", "-c", "1"}, "invalid value"},
		{[]string{"run", "--env", "NOEQUALS", "-c", "1"}, "want K=V"},
		{[]string{"run", "--file", "/nonexistent", "-c", "1"}, "--file"},
		{[]string{"run", "--pids", "0", "-c", "1"}, "pids"},
		{[]string{"run", "--io-read", "0", "-c", "1"}, "--insecure-no-io-limit"},
		{[]string{"run", "--io-read", "100", "-c", "1"}, "disk I/O rates must be between 1MiB and 1TiB"},
		{[]string{"run", "--io-write-iops", "5", "-c", "1"}, "disk I/O operations must be between 10"},
		{[]string{"frobnicate"}, "unknown command"},
	} {
		got := vivarium(t, "", tc.args...)
		if got.code != 2 || !strings.Contains(got.stderr, tc.want) {
			t.Errorf("%v: exit %d stderr %q, want exit 2 and %q", tc.args, got.code, got.stderr, tc.want)
		}
	}
}

func TestDoctor(t *testing.T) {
	needSandbox(t)
	got := vivarium(t, "", "doctor")
	for _, want := range []string{"user namespaces", "seccomp", "overlayfs", "cgroup", "sandbox", "volumes"} {
		if !strings.Contains(strings.ToLower(got.stdout), want) {
			t.Errorf("doctor output lacks %q:\n%s", want, got.stdout)
		}
	}
	if got.code != 0 {
		t.Fatalf("doctor exit %d on a capable host:\n%s%s", got.code, got.stdout, got.stderr)
	}
}

// The doctor names the runsc platform the gvisor backend found to start a
// sandbox, when it can run one.
func TestDoctorNamesTheGvisorPlatform(t *testing.T) {
	needSandbox(t)
	if _, err := exec.LookPath("runsc"); err != nil {
		t.Skip("runsc is not installed")
	}
	got := vivarium(t, "", "doctor", "--json")
	var checks []check
	if err := json.Unmarshal([]byte(got.stdout), &checks); err != nil {
		t.Fatalf("%v: %s", err, got.stdout)
	}
	for _, c := range checks {
		if c.Name != "gvisor backend" {
			continue
		}
		if !c.OK {
			t.Fatalf("gvisor backend: %s", c.Detail)
		}
		if !regexp.MustCompile(`runsc platform (systrap|kvm|ptrace)\b`).MatchString(c.Detail) {
			t.Errorf("gvisor backend: %q names no platform", c.Detail)
		}
		return
	}
	t.Fatalf("no gvisor check in %s", got.stdout)
}
