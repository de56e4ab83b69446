package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/container"
	"github.com/vivarium-sandbox/vivarium/internal/backend/docker"
	"github.com/vivarium-sandbox/vivarium/internal/hostuid"
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
	// What `vivarium run` and the doctor keep for their next runs: the
	// state directories of their backends, empty once they are done.
	t.Cleanup(func() {
		for _, dir := range []string{"/run/vivarium/run-docker", "/run/vivarium/doctor-docker"} {
			os.Remove(dir + "/views")
			if err := os.Remove(dir + "/sandboxes"); err == nil || os.IsNotExist(err) {
				os.Remove(dir)
			}
		}
	})
	got := vivarium(t, "", "image", "build", "--docker-host", d.Host)
	if got.code != 0 || !strings.HasPrefix(got.stdout, "vivarium-sandbox:") || !strings.Contains(got.stderr, "importing") {
		t.Fatalf("image build: exit %d, stdout %q, stderr %q", got.code, got.stdout, got.stderr)
	}
	// Built already: said so.
	if again := vivarium(t, "", "image", "build", "--docker-host", d.Host); again.stdout != got.stdout ||
		!strings.Contains(again.stderr, "has it already") {
		t.Fatalf("second build: %+v", again)
	}
	// The sandbox is a host user of its own, of the pool --docker-uid-base
	// starts.
	got = vivarium(t, "", "run", "--backend", "docker", "--docker-host", d.Host, "--docker-uid-base", fmt.Sprint(dockerUIDBase),
		"--json", "-c", "import os, sys; print(sys.platform, os.getuid()); sys.exit(3)")
	var res sandbox.Result
	if err := json.Unmarshal([]byte(got.stdout), &res); err != nil {
		t.Fatalf("%v: %q %q", err, got.stdout, got.stderr)
	}
	if got.code != 3 || !strings.HasPrefix(res.Stdout, "linux ") {
		t.Fatalf("exit %d: %+v", got.code, res)
	}
	if uid, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(res.Stdout, "linux "))); uid < dockerUIDBase ||
		(uid-dockerUIDBase)%hostuid.RangeSize != container.SandboxUID {
		t.Fatalf("uid %q, want id %d of a range from %d", res.Stdout, container.SandboxUID, dockerUIDBase)
	}
	// gVisor as the daemon's runtime, where the test daemon has runsc; a
	// runtime it lacks is refused, never replaced by its default.
	got = vivarium(t, "", "run", "--backend", "docker", "--docker-host", d.Host, "--docker-runtime", "nope", "-c", "1")
	if got.code != sandbox.ExitSetupFailed || !strings.Contains(got.stderr, `no runtime "nope"`) {
		t.Errorf("unknown runtime: exit %d, stderr %q", got.code, got.stderr)
	}
	if _, err := docker.Check(d.Host, "runsc"); err == nil {
		got = vivarium(t, "", "run", "--backend", "docker", "--docker-host", d.Host, "--docker-runtime", "runsc",
			"-c", "import os; print(os.uname().release)")
		if got.code != 0 || got.stdout != "4.4.0\n" {
			t.Errorf("--docker-runtime runsc: exit %d, stdout %q, stderr %q", got.code, got.stdout, got.stderr)
		}
	}
	// A server offering docker beside its native default: per sandbox.
	srv := startServer(t, t.TempDir(), "--dev", "--zygote=false", "--preload", "", "--offer-backend", "docker", "--docker-host", d.Host,
		"--docker-uid-base", fmt.Sprint(dockerUIDBase), "--docker-uid-ranges", "16", "--max-sandboxes", "16")
	t.Cleanup(func() { stopDockerServer(t, srv, d.Host, serveParent+"-docker") })
	for _, c := range []struct{ path, body, want string }{
		{"/v1/sandboxes", `{"backend":"docker"}`, `"backend":"docker"`},
		{"/v1/execute", `{"code":"import os; print(os.getuid() - ` + fmt.Sprint(dockerUIDBase) + `)","backend":"docker"}`, `"stdout":"`},
		{"/v1/execute", `{"code":"import os; print(os.getuid())"}`, `"status":"ok"`},
	} {
		resp, err := http.Post(srv.url+c.path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 || !strings.Contains(string(body), c.want) {
			t.Errorf("POST %s %s: %d %s", c.path, c.body, resp.StatusCode, body)
		}
		if strings.Contains(c.body, `"docker"`) && strings.Contains(c.body, "getuid") {
			// A host user of its own, of the server's pool.
			var res sandbox.Result
			json.Unmarshal(body, &res)
			if off, err := strconv.Atoi(strings.TrimSpace(res.Stdout)); err != nil || off < 0 || off >= 16*hostuid.RangeSize ||
				off%hostuid.RangeSize != container.SandboxUID {
				t.Errorf("the docker sandbox's uid is %q above --docker-uid-base, want id %d of one of its 16 ranges",
					res.Stdout, container.SandboxUID)
			}
		}
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

// stopDockerServer stops the server as an operator would (SIGTERM), then
// checks that its docker sandboxes left nothing: no container, no mount.
func stopDockerServer(t *testing.T, srv *server, host, name string) {
	srv.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-srv.exited:
	case <-time.After(time.Minute):
		t.Errorf("the server did not stop within a minute of SIGTERM")
		return
	}
	if ids, err := docker.Containers(host, name); err != nil || len(ids) > 0 {
		t.Errorf("containers left: %v (%v)", ids, err)
	}
	dir := "/run/vivarium/" + strings.TrimPrefix(name, "vivarium-")
	for _, m := range testutil.Mounts() {
		if strings.Contains(m, dir+"/") {
			t.Errorf("mount left: %s", m)
		}
	}
	// The backend's state directory stays (empty) for the next server of
	// the name; the test's goes.
	os.Remove(dir + "/sandboxes")
	os.Remove(dir + "/views")
	os.Remove(dir)
}

// dockerUIDBase is the package's docker sandboxes' pool: apart from the
// docker backend's default, and from other packages' tests.
const dockerUIDBase = docker.DefaultUIDBase + docker.DefaultUIDRanges*hostuid.RangeSize + 1<<22
