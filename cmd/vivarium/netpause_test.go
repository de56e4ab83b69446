package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// A sandbox with network access, on a server with its defaults (from the
// zygote's pool): it reaches the allowed host after a pause and a resume;
// it forks into two copies, each reaching it through a proxy of its own
// that records its connections under the copy's id, after the source is
// gone too; a sandbox made of its snapshot has no network access.
func TestServeNetworkAcrossPause(t *testing.T) {
	needSandbox(t)
	if _, err := criu.Usable(); err != nil {
		t.Skipf("pausing needs CRIU, not built here (make criu): %v", err)
	}
	h := testutil.NewNetHost(t)
	hostPort := fmt.Sprintf("%s:%d", h.Addr, h.Port)
	dataDir := t.TempDir()
	srv := startServer(t, dataDir, "--dev", "--allow-net", hostPort)
	networkAcrossPause(t, srv, dataDir, h, func(out string) bool { return out == "unreachable ConnectionRefusedError" })
}

// networkAcrossPause has a sandbox of srv with access to h reach it
// before and after a pause and a resume, fork into two copies that reach
// it through proxies of their own (their connections audited under their
// ids, after the source is gone), and checks that a sandbox of its
// snapshot does not reach it: offline says what such a sandbox prints
// (its stack's refusal differs between backends).
func networkAcrossPause(t *testing.T, srv *server, dataDir string, h *testutil.NetHost, offline func(string) bool) {
	t.Helper()
	hostPort := fmt.Sprintf("%s:%d", h.Addr, h.Port)
	run := func(want int, args ...string) string { t.Helper(); return srv.run(t, want, args...) }
	fetch := fmt.Sprintf(`
import urllib.request
try:
    print(urllib.request.urlopen("http://%s/hello.txt", timeout=20).read().decode().strip())
except OSError as e:
    print("unreachable", type(getattr(e, "reason", e)).__name__)`, hostPort)
	want := "hello from " + h.Name

	id := run(0, "sandbox", "create", "--allow-net", hostPort)
	if out := run(0, "sandbox", "exec", id, "-c", fetch); out != want {
		t.Fatalf("before the pause: %q", out)
	}
	run(0, "sandbox", "pause", id)
	run(0, "sandbox", "resume", id)
	if out := run(0, "sandbox", "exec", id, "-c", fetch); out != want {
		t.Fatalf("after the resume: %q", out)
	}

	snap := run(0, "sandbox", "snapshot", id)
	fromSnap := run(0, "sandbox", "create", "--from-snapshot", snap)
	if out := run(0, "sandbox", "exec", fromSnap, "-c", fetch); !offline(out) {
		t.Errorf("a sandbox made of the snapshot: %q", out)
	}
	run(0, "sandbox", "kill", fromSnap)

	copies := strings.Fields(run(0, "sandbox", "fork", id, "--count", "2"))
	if len(copies) != 2 {
		t.Fatalf("fork printed %q", copies)
	}
	run(0, "sandbox", "kill", id)
	for _, c := range copies {
		if out := run(0, "sandbox", "exec", c, "-c", fetch); out != want {
			t.Errorf("copy %s: %q", c, out)
		}
	}
	run(0, append([]string{"sandbox", "kill"}, copies...)...)
	// The audit log is written in batches: wait for the copies' connections.
	for _, c := range copies {
		testutil.WaitFor(t, 20*time.Second, "copy "+c+"'s connection in the audit log", func() bool {
			audit := srv.cliAs(t, "", "", "audit", "--data-dir", dataDir, "--kind", "net", "--sandbox", c).stdout
			return strings.Contains(audit, hostPort)
		})
	}
}
