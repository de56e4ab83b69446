package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// vivariumEnv runs the command with extra environment variables.
func vivariumEnv(t *testing.T, env []string, args ...string) cli {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), "VIVARIUM_TEST_MAIN=1"), env...)
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

// Without a daemon, --backend docker is a setup failure that names what
// is missing, not a run on something weaker.
func TestRunDockerUnavailable(t *testing.T) {
	t.Parallel()
	got := vivarium(t, "", "run", "--backend", "docker", "--docker-host", "unix:///nonexistent/docker.sock", "-c", "1")
	want := "no Docker daemon socket at /nonexistent/docker.sock"
	if os.Geteuid() != 0 {
		want = "needs root"
	}
	if got.code != sandbox.ExitSetupFailed || !strings.Contains(got.stderr, want) {
		t.Fatalf("exit %d, stderr %q", got.code, got.stderr)
	}
	got = vivarium(t, "", "image", "build", "--docker-host", "unix:///nonexistent/docker.sock")
	if got.code != 1 || !strings.Contains(got.stderr, "no Docker daemon socket") {
		t.Fatalf("image build: exit %d, stderr %q", got.code, got.stderr)
	}
}

// With a daemon: image build, run, and the doctor's docker check.
func TestDocker(t *testing.T) {
	needSandbox(t)
	d := testutil.RequireDockerd(t)
	got := vivarium(t, "", "image", "build", "--docker-host", d.Host)
	if got.code != 0 || !strings.HasPrefix(got.stdout, "vivarium-sandbox:") || !strings.Contains(got.stderr, "importing") {
		t.Fatalf("image build: exit %d, stdout %q, stderr %q", got.code, got.stdout, got.stderr)
	}
	// Built already: said so.
	if again := vivarium(t, "", "image", "build", "--docker-host", d.Host); again.stdout != got.stdout ||
		!strings.Contains(again.stderr, "has it already") {
		t.Fatalf("second build: %+v", again)
	}
	got = vivarium(t, "", "run", "--backend", "docker", "--docker-host", d.Host, "--json", "-c",
		"import os, sys; print(os.getuid(), sys.platform); sys.exit(3)")
	var res sandbox.Result
	if err := json.Unmarshal([]byte(got.stdout), &res); err != nil {
		t.Fatalf("%v: %q %q", err, got.stdout, got.stderr)
	}
	if got.code != 3 || res.Stdout != "1000 linux\n" {
		t.Fatalf("exit %d: %+v", got.code, res)
	}
	got = vivariumEnv(t, []string{"DOCKER_HOST=" + d.Host}, "doctor", "--json")
	if c := findCheck(t, got.stdout, "docker backend"); !c.OK || !strings.Contains(c.Detail, "CPython") {
		t.Fatalf("doctor with a daemon: %+v", c)
	}
	got = vivariumEnv(t, []string{"DOCKER_HOST=unix:///nonexistent/docker.sock"}, "doctor", "--json")
	if c := findCheck(t, got.stdout, "docker backend"); c.OK || !c.Optional || !strings.Contains(c.Detail, "no Docker daemon socket") {
		t.Fatalf("doctor without a daemon: %+v", c)
	}
}

func findCheck(t *testing.T, out, name string) check {
	t.Helper()
	var checks []check
	if err := json.Unmarshal([]byte(out), &checks); err != nil {
		t.Fatalf("%v: %q", err, out)
	}
	for _, c := range checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no %q check: %+v", name, checks)
	return check{}
}
