package e2b

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

func TestMain(m *testing.M) {
	if native.IsInit() {
		native.RunInit()
	}
	code := m.Run()
	if os.Geteuid() == 0 {
		if left := testutil.CgroupsUnder(nativeCgroupParent); len(left) > 0 {
			println("cgroups left behind:", strings.Join(left, " "))
			code = 1
		}
	}
	os.Exit(code)
}

// This package's own cgroup parent and uid range for its tests on the
// native backend, apart from the other packages' leftover checks.
const (
	nativeCgroupParent = "vivarium-e2b-unit-test"
	nativeUIDBase      = native.DefaultUIDBase + 27<<24
)

var (
	nativeOnce    sync.Once
	nativeBackend *native.Backend
	nativeErr     error
)

// newPausingServer serves the adapter over the native backend, whose
// sandboxes CRIU pauses, with the keys "key-a" (owner a) and "key-b"
// (owner b). It skips, saying why, where sandboxes cannot be paused.
func newPausingServer(t *testing.T) (*httptest.Server, *Server, *service.Service) {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	if _, err := criu.Usable(); err != nil {
		t.Skipf("pausing needs CRIU, not usable here (make criu, or set VIVARIUM_CRIU_DIR): %v", err)
	}
	nativeOnce.Do(func() {
		nativeBackend, nativeErr = native.New(native.Config{CgroupParent: nativeCgroupParent, UIDBase: nativeUIDBase,
			UIDRanges: testutil.UIDRanges})
	})
	if nativeErr != nil {
		t.Fatal(nativeErr)
	}
	svc := service.New(service.Config{Backend: nativeBackend})
	t.Cleanup(func() { svc.Close() })
	h := New(Config{Service: svc, Auth: keys{"key-a": "a", "key-b": "b"}, Prefix: "/e2b"})
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts, h, svc
}

// One key's traffic never wakes another key's paused sandbox: key a's
// short-lived sandboxes, created, listed and watched, make the adapter
// forget what it kept of sandboxes that are gone, and key b's sandbox,
// paused with autoResume, stays paused through it all.
func TestSweepsResumeNoOne(t *testing.T) {
	ts, h, svc := newPausingServer(t)
	// A sweep of templates once there are 4 of them, gone ones most.
	h.templateSweepAt = 4
	c := client{t, ts.URL}
	keyA := map[string]string{"X-API-Key": "key-a"}
	keyB := map[string]string{"X-API-Key": "key-b", "Content-Type": "application/json"}

	b := c.create("key-b", `{"autoPause":true,"autoResume":{"enabled":true},"timeout":600}`)
	if status, out := c.rpc(b, "filesystem.Filesystem/CreateWatcher", `{"path":"/home/user"}`, nil); status != 200 {
		t.Fatalf("b's watcher: %d %v", status, out)
	}
	if resp, body := c.do("POST", "/e2b/sandboxes/"+b.SandboxID+"/pause", nil, keyB); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("pause b's sandbox: %d %s", resp.StatusCode, body)
	}
	paused := func(after string) {
		t.Helper()
		if info, err := svc.Info("b", b.SandboxID); err != nil || info.State != "paused" {
			t.Fatalf("after %s, b's sandbox is %q (%v), want it still paused", after, info.State, err)
		}
	}
	paused("the pause")

	// Key a's sandboxes come and go by their timeout (not through E2B's
	// kill, which forgets a template at once).
	for range h.templateSweepAt {
		c.create("key-a", `{"timeout":1}`)
	}
	testutil.WaitFor(t, time.Minute, "key a's sandboxes to time out", func() bool { return len(svc.List("a")) == 0 })
	a := c.create("key-a", `{}`) // the sweep of templates
	paused("key a's creates")
	h.mu.Lock()
	remembered := len(h.templates)
	h.mu.Unlock()
	if remembered != 2 {
		t.Errorf("%d templates remembered, want 2 (b's, and a's live sandbox's): the sweep did not run", remembered)
	}
	if status, out := c.rpc(a, "filesystem.Filesystem/CreateWatcher", `{"path":"/home/user"}`, nil); status != 200 { // the sweep of watchers
		t.Fatalf("a's watcher: %d %v", status, out)
	}
	paused("key a's watcher")
	if resp, body := c.do("GET", "/e2b/v2/sandboxes", nil, keyA); resp.StatusCode != http.StatusOK ||
		!strings.Contains(string(body), a.SandboxID) || strings.Contains(string(body), b.SandboxID) {
		t.Fatalf("key a's list: %d %s", resp.StatusCode, body)
	}
	paused("key a's list")
	h.mu.Lock()
	watchers := len(h.watchers)
	h.mu.Unlock()
	if watchers != 2 {
		t.Errorf("%d watchers kept, want 2: b's paused sandbox's was forgotten", watchers)
	}

	// b's own connect resumes it, as it should.
	if resp, body := c.do("POST", "/e2b/sandboxes/"+b.SandboxID+"/connect", strings.NewReader(`{}`), keyB); resp.StatusCode != http.StatusOK {
		t.Fatalf("connect: %d %s", resp.StatusCode, body)
	}
	if info, _ := svc.Info("b", b.SandboxID); info.State == "paused" {
		t.Errorf("b's connect left its sandbox paused")
	}
}
