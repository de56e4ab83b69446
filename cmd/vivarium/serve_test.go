package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/store"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// Servers started by these tests use their own cgroup parent and uid range,
// apart from the `vivarium run` tests of this package.
const (
	serveParent  = "vivarium-serve-test"
	serveUIDBase = native.DefaultUIDBase + 5<<24
)

type server struct {
	cmd     *exec.Cmd
	url     string
	dataDir string
	log     *testutil.Buffer
	exited  chan struct{}
}

func freePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startServer runs `vivarium serve` as its own process and waits until it
// answers.
func startServer(t testing.TB, dataDir string, extra ...string) *server {
	t.Helper()
	addr := freePort(t)
	args := append([]string{"serve", "--listen", addr, "--data-dir", dataDir, "--cgroup-parent", serveParent,
		"--uid-base", fmt.Sprint(serveUIDBase), "--uid-ranges", fmt.Sprint(testutil.UIDRanges)}, extra...)
	s := startVivarium(t, "server", "http://"+addr, args...)
	s.dataDir = dataDir
	return s
}

// startVivarium starts this binary with args (a server, or a gateway,
// what), whose /healthz answers at url once it is up; its log is shown
// if the test fails, and it is killed when the test ends.
func startVivarium(t testing.TB, what, url string, args ...string) *server {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "VIVARIUM_TEST_MAIN=1")
	s := &server{cmd: cmd, url: url, log: &testutil.Buffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = s.log, s.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-s.exited
		if t.Failed() {
			t.Logf("%s log:\n%s", what, s.log)
		}
	})
	testutil.WaitFor(t, 30*time.Second, "the "+what+" to answer", func() bool {
		select {
		case <-s.exited:
			t.Fatalf("the %s exited: %s", what, s.log)
		default:
		}
		resp, err := http.Get(s.url + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	return s
}

// cliAs runs a vivarium subcommand as a client of s with key.
func (s *server) cliAs(t *testing.T, key string, stdin string, args ...string) cli {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "VIVARIUM_TEST_MAIN=1", "VIVARIUM_URL="+s.url, "VIVARIUM_API_KEY="+key,
		"VIVARIUM_DATA_DIR="+s.dataDir)
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

func createKey(t *testing.T, dataDir, name string) (token, id string) {
	t.Helper()
	r := vivarium(t, "", "keys", "create", "--data-dir", dataDir, "--json", name)
	if r.code != 0 {
		t.Fatalf("keys create: %d %s", r.code, r.stderr)
	}
	var out struct {
		Token string
		Key   struct{ ID string }
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatal(err)
	}
	return out.Token, out.Key.ID
}

// The whole path a user takes by hand: keys, a server, the CLI client
// creating a sandbox, keeping state, files in and out, a chart, a shell
// command, another key seeing nothing, the audit log, revocation.
func TestServeEndToEnd(t *testing.T) {
	needSandbox(t)
	testutil.RequirePythonModules(t, "pandas", "matplotlib")
	dataDir := t.TempDir()
	alice, aliceID := createKey(t, dataDir, "alice")
	bob, _ := createKey(t, dataDir, "bob")
	srv := startServer(t, dataDir)

	must := func(r cli, what string) cli {
		t.Helper()
		if r.code != 0 {
			t.Fatalf("%s: exit %d\nstdout: %s\nstderr: %s", what, r.code, r.stdout, r.stderr)
		}
		return r
	}
	id := strings.TrimSpace(must(srv.cliAs(t, alice, "", "sandbox", "create", "--idle-timeout", "2m"), "create").stdout)
	if !strings.HasPrefix(id, "sb_") {
		t.Fatalf("id %q", id)
	}
	must(srv.cliAs(t, alice, "", "sandbox", "exec", id, "-c", "x = 41"), "exec 1")
	if r := must(srv.cliAs(t, alice, "", "sandbox", "exec", id, "-c", "x + 1"), "exec 2"); r.stdout != "42\n" {
		t.Fatalf("state not kept: %q", r.stdout)
	}
	csv := filepath.Join(t.TempDir(), "sales.csv")
	os.WriteFile(csv, []byte("month,sales\njan,10\nfeb,14\nmar,9\n"), 0o644)
	must(srv.cliAs(t, alice, "", "sandbox", "put", id, csv, "data/sales.csv"), "put")
	const plot = `
import pandas as pd
import matplotlib.pyplot as plt
df = pd.read_csv("data/sales.csv")
print(df["sales"].sum())
df.plot(x="month", y="sales").get_figure().savefig("sales.png")
`
	r := must(srv.cliAs(t, alice, plot, "sandbox", "exec", id, "-"), "plot")
	if !strings.HasPrefix(r.stdout, "33\n") {
		t.Fatalf("pandas: %q %s", r.stdout, r.stderr)
	}
	png := filepath.Join(t.TempDir(), "sales.png")
	must(srv.cliAs(t, alice, "", "sandbox", "get", id, "sales.png", png), "get")
	if b, _ := os.ReadFile(png); !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Fatalf("downloaded file is not a PNG: %.20q", b)
	}
	if r := must(srv.cliAs(t, alice, "", "sandbox", "sh", id, "ls", "data"), "sh"); r.stdout != "sales.csv\n" {
		t.Fatalf("sh: %q", r.stdout)
	}
	if r := srv.cliAs(t, alice, "", "sandbox", "exec", id, "-c", "1/0"); r.code != 1 || !strings.Contains(r.stderr, "ZeroDivisionError") {
		t.Fatalf("exception: %+v", r)
	}
	if r := must(srv.cliAs(t, alice, "", "sandbox", "list"), "list"); !strings.Contains(r.stdout, id) {
		t.Fatalf("list: %s", r.stdout)
	}

	// Bob sees nothing of alice's sandbox.
	if r := srv.cliAs(t, bob, "", "sandbox", "exec", id, "-c", "x"); r.code != 3 || !strings.Contains(r.stderr, "not found") {
		t.Fatalf("bob reached alice's sandbox: %+v", r)
	}
	if r := must(srv.cliAs(t, bob, "", "sandbox", "list"), "bob list"); strings.Contains(r.stdout, id) {
		t.Fatalf("bob lists alice's sandbox: %s", r.stdout)
	}
	if r := srv.cliAs(t, "viv_forged", "", "sandbox", "list"); r.code == 0 || !strings.Contains(r.stderr, "401") {
		t.Fatalf("a forged key: %+v", r)
	}

	// The audit log has every one of alice's executions whose answer
	// came, read at once (a record is stored before its answer is sent),
	// with the hash of the code.
	r = must(vivarium(t, "", "audit", "--data-dir", dataDir, "--key", aliceID, "--json"), "audit")
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var rec struct {
			Kind, Status string
			SandboxID    string `json:"sandbox_id"`
			Code         string `json:"code_sha256"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("audit: %v: %s", err, line)
		}
		if rec.SandboxID != id {
			t.Errorf("audit record of another sandbox: %s", line)
		}
		got = append(got, rec.Kind+" "+rec.Status+" "+rec.Code[:12])
	}
	h := func(code string) string { return store.CodeHash(code)[:12] }
	want := []string{ // newest first
		"execute error " + h("1/0"), "command ok " + h("ls data"), "execute ok " + h(plot),
		"execute ok " + h("x + 1"), "execute ok " + h("x = 41"),
	}
	if !slices.Equal(got, want) {
		t.Fatalf("audit records:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	must(srv.cliAs(t, alice, "", "sandbox", "kill", id), "kill")
	if r := srv.cliAs(t, alice, "", "sandbox", "info", id); r.code != 3 {
		t.Fatalf("killed sandbox still answers: %+v", r)
	}

	// A revoked key stops working within the cache's few seconds.
	must(vivarium(t, "", "keys", "revoke", "--data-dir", dataDir, "bob"), "revoke")
	testutil.WaitFor(t, 10*time.Second, "the revoked key to be refused", func() bool {
		return srv.cliAs(t, bob, "", "sandbox", "list").code != 0
	})
}

// groupProcs lists the host pids in the test server's sandbox cgroups,
// those of its keys' groups (parent/KEY/SANDBOX) included.
func groupProcs() []int {
	var pids []int
	var files []string
	for _, root := range []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup"} {
		for _, pattern := range []string{"*", "*/*"} {
			m, _ := filepath.Glob(filepath.Join(root, serveParent, pattern, "cgroup.procs"))
			files = append(files, m...)
		}
	}
	for _, f := range files {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				pids = append(pids, n)
			}
		}
	}
	return pids
}

// After SIGKILL of the server, no sandbox process survives it, and the
// next server removes the cgroups the dead one left.
func TestServeCleansUpAfterKill9(t *testing.T) {
	needSandbox(t)
	dataDir := t.TempDir()
	token, _ := createKey(t, dataDir, "k")
	srv := startServer(t, dataDir)
	id := strings.TrimSpace(srv.cliAs(t, token, "", "sandbox", "create").stdout)
	// A daemon that double-forks and ignores signals, and a busy execution.
	r := srv.cliAs(t, token, "", "sandbox", "sh", id, "(trap '' TERM HUP INT; setsid sleep 1000 &) ; echo started")
	if r.stdout != "started\n" {
		t.Fatalf("sh: %+v", r)
	}
	busy := exec.Command(os.Args[0], "sandbox", "exec", id, "-c", "print('busy', flush=True)\nwhile True: pass")
	busy.Env = append(os.Environ(), "VIVARIUM_TEST_MAIN=1", "VIVARIUM_URL="+srv.url, "VIVARIUM_API_KEY="+token)
	var busyOut testutil.Buffer
	busy.Stdout = &busyOut
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	defer busy.Wait()
	testutil.WaitFor(t, 30*time.Second, "the busy execution to run", func() bool { return strings.Contains(busyOut.String(), "busy") })
	pids := groupProcs()
	if len(pids) < 3 {
		t.Fatalf("sandbox processes: %v", pids)
	}
	srv.cmd.Process.Signal(syscall.SIGKILL)
	<-srv.exited
	testutil.WaitFor(t, 10*time.Second, "the sandbox's processes to die with the server", func() bool {
		for _, p := range pids {
			if syscall.Kill(p, 0) == nil {
				return false
			}
		}
		return true
	})
	old := testutil.CgroupsUnder(serveParent)
	if len(old) == 0 {
		t.Fatal("no cgroup was left behind to sweep: the test proves nothing")
	}
	srv2 := startServer(t, dataDir)
	// The new server has sandboxes of its own (its pool); none of the
	// dead one's groups remain.
	for _, g := range testutil.CgroupsUnder(serveParent) {
		if slices.Contains(old, g) {
			t.Errorf("a group the dead server left is still there: %s", g)
		}
	}
	if !strings.Contains(srv2.log.String(), "removed sandboxes an earlier server left behind") {
		t.Errorf("the restarted server did not report its sweep:\n%s", srv2.log)
	}
	// A second server on the same cgroup parent is refused: its sweep
	// would kill the first one's sandboxes.
	r = vivarium(t, "", "serve", "--listen", freePort(t), "--data-dir", t.TempDir(), "--cgroup-parent", serveParent)
	if r.code == 0 || !strings.Contains(r.stderr, "another vivarium server uses the cgroup parent") {
		t.Fatalf("second server on the same parent: %+v", r)
	}
}

// SIGTERM: new work is refused, a running execution that ignores
// KeyboardInterrupt is ended after the grace period, every sandbox is
// destroyed, and the server exits 0.
func TestServeGracefulShutdown(t *testing.T) {
	needSandbox(t)
	dataDir := t.TempDir()
	token, _ := createKey(t, dataDir, "k")
	srv := startServer(t, dataDir, "--shutdown-grace", "1s")
	id := strings.TrimSpace(srv.cliAs(t, token, "", "sandbox", "create").stdout)
	// "running" is printed inside the try: once it is out, an interrupt
	// is caught.
	long := exec.Command(os.Args[0], "sandbox", "exec", id, "-c", `
import time
said = False
while True:
    try:
        if not said:
            print("running", flush=True)
            said = True
        time.sleep(0.05)
    except KeyboardInterrupt:
        print("ignored", flush=True)
`)
	long.Env = append(os.Environ(), "VIVARIUM_TEST_MAIN=1", "VIVARIUM_URL="+srv.url, "VIVARIUM_API_KEY="+token)
	var longOut testutil.Buffer
	long.Stdout = &longOut
	if err := long.Start(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the execution to run", func() bool { return strings.Contains(longOut.String(), "running") })
	start := time.Now()
	srv.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-srv.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the server did not exit within 30 s of SIGTERM")
	}
	t.Logf("exited %v after SIGTERM", time.Since(start).Round(time.Millisecond))
	if code := srv.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit status %d", code)
	}
	long.Wait()
	if !strings.Contains(longOut.String(), "ignored") {
		t.Errorf("the execution was not interrupted: %q", longOut.String())
	}
	if left := testutil.CgroupsUnder(serveParent); len(left) > 0 {
		t.Errorf("cgroups left: %v", left)
	}
	if p := groupProcs(); len(p) > 0 {
		t.Errorf("processes left: %v", p)
	}
}

func TestServeRefusesBadConfig(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--dev", "--listen", "0.0.0.0:8080"}, "loopback only"},
		{[]string{"--listen", "nonsense"}, "want HOST:PORT"},
		{[]string{"--log-format", "xml"}, "--log-format"},
		{[]string{"--max-memory", "1KiB"}, "memory must be"},
		{[]string{"--idle-timeout", "2h", "--max-idle-timeout", "1h"}, "--idle-timeout"},
		{[]string{"stray"}, "unexpected arguments"},
		{[]string{"--backend", "qemu"}, `unknown backend "qemu"`},
		{[]string{"--offer-backend", "gvisor,firecracker"}, `unknown backend "firecracker"`},
		{[]string{"--io-read-iops", "0"}, "--insecure-no-io-limit"},
		{[]string{"--io-write", "1KiB"}, "disk I/O rates must be"},
		{[]string{"--io-disk-of", "/dev/shm"}, "/dev/shm is on no block device"},
		{[]string{"--audit-max-rows", "-1"}, "--audit-max-rows must not be negative"},
	} {
		r := vivarium(t, "", append([]string{"serve"}, c.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("serve %v: exit %d, stderr %q; want 2 and %q", c.args, r.code, r.stderr, c.want)
		}
	}
	cmd := exec.Command(os.Args[0], "serve", "--listen", "nonsense")
	cmd.Env = append(os.Environ(), "VIVARIUM_TEST_MAIN=1", "VIVARIUM_LISTEN=also-nonsense")
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), `"nonsense"`) {
		t.Errorf("the flag should win over the environment: %s", out)
	}
	cmd = exec.Command(os.Args[0], "serve")
	cmd.Env = append(os.Environ(), "VIVARIUM_TEST_MAIN=1", "VIVARIUM_MAX_SANDBOXES=many")
	out, _ = cmd.CombinedOutput()
	if !strings.Contains(string(out), "VIVARIUM_MAX_SANDBOXES") {
		t.Errorf("a bad environment setting is not named: %s", out)
	}
}

// A web page cannot drive the API, even in --dev mode where no key is
// needed: a browser's request carries an Origin header.
func TestServeRefusesWebPages(t *testing.T) {
	needSandbox(t)
	srv := startServer(t, t.TempDir(), "--dev", "--pool", "0", "--zygote=false", "--preload", "")
	for _, h := range []map[string]string{
		{"Origin": "https://evil.example"},
		{"Origin": "null"},
		{"Sec-Fetch-Site": "cross-site"},
	} {
		req, _ := http.NewRequest("POST", srv.url+"/v1/execute", strings.NewReader(`{"code": "print(1)"}`))
		req.Header.Set("Content-Type", "text/plain")
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("a request with %v: %d, want 403", h, resp.StatusCode)
		}
	}
	resp, err := http.Post(srv.url+"/v1/execute", "application/json", strings.NewReader(`{"code": "print(1)"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("a program's request: %d", resp.StatusCode)
	}
	// DNS rebinding: a page's GETs carry no Origin, and name the page's
	// own host, which the server on loopback refuses on every API; a
	// host the operator allows passes.
	allowed := startServer(t, t.TempDir(), "--dev", "--pool", "0", "--zygote=false", "--preload", "",
		"--allow-host", "vivarium.internal", "--cgroup-parent", "vivarium-serve-hosts-test",
		"--uid-base", fmt.Sprint(native.DefaultUIDBase+23<<24))
	for _, path := range []string{"/v1/sandboxes", "/e2b/sandboxes", "/e2b/v2/sandboxes", "/mcp", "/metrics"} {
		for host, want := range map[string]int{"attacker.example": 403, "vivarium.internal:8080": 0} {
			req, _ := http.NewRequest("GET", allowed.url+path, nil)
			req.Host = host
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if want == 403 && resp.StatusCode != 403 || want == 0 && resp.StatusCode == 403 && path != "/mcp" {
				t.Errorf("GET %s with Host %s: %d", path, host, resp.StatusCode)
			}
		}
	}
}

// A data directory made 0700 (by an older `vivarium keys create`) with the
// checkpoints below it is given o+x; one with the checkpoints elsewhere
// is left as it is.
func TestLetThrough(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, c := range []struct {
		sub  string
		want os.FileMode
	}{{"checkpoints/p", 0o711}, {"../elsewhere", 0o700}} {
		dir := filepath.Join(t.TempDir(), "data")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		letThrough(dir, filepath.Join(dir, c.sub), log)
		if st, _ := os.Stat(dir); st.Mode().Perm() != c.want {
			t.Errorf("checkpoints at %s: mode %04o, want %04o", c.sub, st.Mode().Perm(), c.want)
		}
	}
}

// A client that asks for many configurations (here, environments) makes
// the server keep no more of its configurations ready than
// --pool-configs: the least recently used are dropped, their ready
// sandboxes closed.
func TestServePoolConfigsBound(t *testing.T) {
	needSandbox(t)
	srv := startServer(t, t.TempDir(), "--dev", "--pool", "1", "--pool-configs", "2", "--cgroup-parent", serveParent+"-poolconfigs")
	for i := range 6 {
		code, body := req(t, "POST", srv.url+"/v1/sandboxes", nil, map[string]any{"env": map[string]string{"N": fmt.Sprint(i)}})
		var info struct{ ID string }
		if json.Unmarshal(body, &info); code != 201 {
			t.Fatalf("create %d: %d %s", i, code, body)
		}
		if code, body := req(t, "DELETE", srv.url+"/v1/sandboxes/"+info.ID, nil, nil); code != 204 {
			t.Fatalf("delete %d: %d %s", i, code, body)
		}
	}
	testutil.WaitFor(t, 30*time.Second, "the pool's refills", func() bool { return metric(t, srv, "vivarium_pool_creating") == 0 })
	if n := metric(t, srv, "vivarium_pool_configurations"); n > 2 {
		t.Errorf("%d configurations kept ready, want at most 2", n)
	}
	if n := metric(t, srv, "vivarium_pool_ready"); n > 2 {
		t.Errorf("%d sandboxes kept ready, want at most 2", n)
	}
	if n := metric(t, srv, "vivarium_pool_evictions_total"); n < 4 {
		t.Errorf("%d configurations evicted, want at least 4", n)
	}
}
