package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/gvisor"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// metric reads one of the server's metrics without labels.
func metric(t *testing.T, srv *server, name string) int64 {
	t.Helper()
	code, body := req(t, "GET", srv.url+"/metrics", nil, nil)
	if code != 200 {
		t.Fatalf("GET /metrics: %d %s", code, body)
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return n
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// A server that offers gvisor serves gVisor one-shots from its pool: the
// first makes its sandbox, the next takes one the pool started meanwhile
// (the pool counts the hit), fresh, under gVisor's kernel; the server's
// stop leaves no runsc container, cgroup or mount behind.
func TestServeGvisorOneShotsFromThePool(t *testing.T) {
	needSandbox(t)
	if err := gvisor.Check(); err != nil {
		t.Skip(err)
	}
	const parent = serveParent + "-gvisor"
	stateDir := "/run/vivarium/gvisor/" + parent
	srv := startServer(t, t.TempDir(), "--dev", "--zygote=false", "--preload", "", "--offer-backend", "gvisor",
		"--max-sandboxes", "16")
	t.Cleanup(func() {
		srv.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-srv.exited:
		case <-time.After(time.Minute):
			t.Errorf("the server did not stop within a minute of SIGTERM")
			return
		}
		out, err := exec.Command("runsc", "--root", stateDir+"/runsc", "list", "-quiet").Output()
		if err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("runsc containers left: %q (%v)", out, err)
		}
		if left := testutil.CgroupsUnder(parent); len(left) > 0 {
			t.Errorf("cgroups left: %v", left)
		}
		for _, m := range testutil.Mounts() {
			if strings.Contains(m, stateDir+"/") {
				t.Errorf("mount left: %s", m)
			}
		}
		// The backend's state directory stays, empty, for the next server
		// of the name; the test's goes.
		os.Remove(stateDir + "/sandboxes")
		os.Remove(stateDir + "/runsc")
		os.Remove(stateDir)
	})
	oneShot := func(code string) string {
		t.Helper()
		var res sandbox.Result
		if status := call(t, "", "POST", srv.url+"/v1/execute", map[string]any{"code": code, "backend": "gvisor"}, &res); status != 200 || res.Status != sandbox.StatusOK {
			t.Fatalf("POST /v1/execute %q: %d %+v", code, status, res)
		}
		return res.Stdout
	}

	// gVisor's kernel says it is Linux 4.4.0.
	if got := oneShot("import os; open('/tmp/leak', 'w').write('x'); print(os.uname().release)"); got != "4.4.0\n" {
		t.Fatalf("first one-shot: %q, want gVisor's 4.4.0", got)
	}
	testutil.WaitFor(t, 2*time.Minute, "the pool to refill", func() bool {
		return metric(t, srv, "vivarium_pool_creating") == 0
	})
	hits := metric(t, srv, "vivarium_pool_hits_total")
	if got := oneShot("import os; print(os.uname().release, os.path.exists('/tmp/leak'))"); got != "4.4.0 False\n" {
		t.Errorf("second one-shot: %q, want a fresh gVisor sandbox", got)
	}
	if got := metric(t, srv, "vivarium_pool_hits_total"); got != hits+1 {
		t.Errorf("pool hits %d after the second one-shot, want %d: it did not come from the pool", got, hits+1)
	}
}

// A gVisor sandbox with network access, on a server whose default backend
// is gvisor: it reaches the allowed host through its proxy (the agent
// carries the connections out of gVisor's network stack), after a pause
// and a resume too; it forks into two copies, each reaching it through a
// proxy of its own that records its connections under the copy's id; a
// sandbox made of its snapshot has no network access.
func TestServeGvisorNetworkAcrossPause(t *testing.T) {
	needSandbox(t)
	if err := gvisor.Check(); err != nil {
		t.Skip(err)
	}
	h := testutil.NewNetHost(t)
	hostPort := fmt.Sprintf("%s:%d", h.Addr, h.Port)
	dataDir := t.TempDir()
	srv := startServer(t, dataDir, "--dev", "--backend", "gvisor", "--pool", "0", "--allow-net", hostPort,
		"--cgroup-parent", serveParent+"-gvnet")
	t.Cleanup(func() {
		srv.cmd.Process.Signal(syscall.SIGTERM)
		<-srv.exited
	})
	networkAcrossPause(t, srv, dataDir, h, func(out string) bool { return strings.HasPrefix(out, "unreachable ") })
}
