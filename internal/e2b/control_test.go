package e2b

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// connect with a shorter timeout than the sandbox has leaves its end
// where it was; a longer one moves it later.
func TestConnectNeverShortens(t *testing.T) {
	ts, _ := newTestServer(t)
	c := client{t, ts.URL}
	auth := map[string]string{"X-API-Key": "key-a"}
	sb := c.create("key-a", `{"timeout":600}`)
	endAt := func() time.Time {
		t.Helper()
		resp, b := c.do("GET", "/e2b/sandboxes/"+sb.SandboxID, nil, auth)
		var d listedSandbox
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &d) != nil {
			t.Fatalf("get: %d %s", resp.StatusCode, b)
		}
		return d.EndAt
	}
	before := endAt()
	if resp, b := c.do("POST", "/e2b/sandboxes/"+sb.SandboxID+"/connect", strings.NewReader(`{"timeout":5}`), auth); resp.StatusCode != http.StatusOK {
		t.Fatalf("connect: %d %s", resp.StatusCode, b)
	}
	if after := endAt(); !after.Equal(before) {
		t.Fatalf("a connect with 5 s moved the end from %s to %s", before, after)
	}
	if resp, _ := c.do("POST", "/e2b/sandboxes/"+sb.SandboxID+"/connect", strings.NewReader(`{"timeout":3000}`), auth); resp.StatusCode != http.StatusOK {
		t.Fatal("connect")
	}
	if after := endAt(); !after.After(before) {
		t.Fatalf("a connect with 3000 s left the end at %s (was %s)", after, before)
	}
	if resp, _ := c.do("POST", "/e2b/sandboxes/"+sb.SandboxID+"/connect", strings.NewReader(`{"timeout":-1}`), auth); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("negative: %d", resp.StatusCode)
	}
}

// File info as envd gives it: mode is the permission bits, the owner and
// group are "user", a link names its target, metadata is surfaced.
func TestEntryInfo(t *testing.T) {
	ts, svc := newTestServer(t)
	c := client{t, ts.URL}
	sb := c.create("key-a", `{}`)
	ws, done, err := svc.Workspace("a", sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	ed := ws.(sandbox.WorkspaceEditor)
	ed.Mkdir("d")
	ws.WriteFile("d/f.txt", strings.NewReader("hi"), 100)
	done()
	h := sandboxHeaders(sb, envdPort)
	h["Content-Type"] = "application/octet-stream"
	h["X-Metadata-Author"] = "mish"
	c.do("POST", "/e2b/sandbox/files?path=m.txt", strings.NewReader("x"), h)

	stat := func(p string) map[string]any {
		t.Helper()
		status, out := c.rpc(sb, "filesystem.Filesystem/Stat", `{"path":"`+p+`"}`, nil)
		e, ok := out["entry"].(map[string]any)
		if status != 200 || !ok {
			t.Fatalf("stat %s: %d %v", p, status, out)
		}
		return e
	}
	d := stat("/home/user/d")
	if d["mode"] != float64(0o755) || d["permissions"] != "drwxr-xr-x" || d["owner"] != "user" || d["group"] != "user" || d["symlinkTarget"] != nil {
		t.Errorf("directory: %v", d)
	}
	if m := stat("m.txt"); fmt.Sprint(m["metadata"]) != "map[author:mish]" || m["mode"].(float64) > 0o777 {
		t.Errorf("file with metadata: %v", m)
	}
	if f := stat("d/f.txt"); f["metadata"] != nil {
		t.Errorf("a file without metadata has some: %v", f)
	}
	// A link names its target, as an absolute path in the sandbox.
	if err := os.Symlink("f.txt", filepath.Join(wsDir(t, svc, sb), "d", "l")); err != nil {
		t.Fatal(err)
	}
	if l := stat("d/l"); l["symlinkTarget"] != "/home/user/d/f.txt" || l["type"] != "FILE_TYPE_SYMLINK" {
		t.Errorf("link: %v", l)
	}
}

// wsDir is the host directory of a fake sandbox's workspace.
func wsDir(t *testing.T, svc *service.Service, sb created) string {
	t.Helper()
	b, err := svc.Get("a", sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	return b.Sandbox().(*fakeSandbox).dir
}

func TestMetrics(t *testing.T) {
	ts, _ := newTestServer(t)
	c := client{t, ts.URL}
	auth := map[string]string{"X-API-Key": "key-a"}
	sb := c.create("key-a", `{}`)
	resp, b := c.do("GET", "/e2b/sandboxes/"+sb.SandboxID+"/metrics", nil, auth)
	var got []sandboxMetric
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &got) != nil || len(got) == 0 ||
		got[0].MemTotal <= 0 || got[0].DiskTotal <= 0 || got[0].CPUCount <= 0 || got[0].TimestampUnix == 0 {
		t.Fatalf("metrics: %d %s", resp.StatusCode, b)
	}
	if resp, b := c.do("GET", "/e2b/sandboxes/"+sb.SandboxID+"/metrics", nil, map[string]string{"X-API-Key": "key-b"}); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("another key's: %d %s", resp.StatusCode, b)
	}
	if resp, _ := c.do("GET", "/e2b/sandboxes/"+sb.SandboxID+"/metrics?start=yesterday", nil, auth); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad start: %d", resp.StatusCode)
	}
	other := c.create("key-b", `{}`)
	resp, b = c.do("GET", "/e2b/sandboxes/metrics?sandbox_ids="+sb.SandboxID+","+other.SandboxID, nil, auth)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), sb.SandboxID) || strings.Contains(string(b), other.SandboxID) {
		t.Fatalf("latest metrics: %d %s", resp.StatusCode, b)
	}
}

// What Vivarium does not do yet is still checked as E2B checks it: a fork
// of fewer than one copy is a bad request, a sandbox that is gone or
// another key's is not found, and only then is the answer 501.
func TestUnsupportedChecksFirst(t *testing.T) {
	ts, _ := newTestServer(t)
	c := client{t, ts.URL}
	sb := c.create("key-a", `{}`)
	auth := map[string]string{"X-API-Key": "key-a", "Content-Type": "application/json"}
	other := map[string]string{"X-API-Key": "key-b", "Content-Type": "application/json"}
	for _, tc := range []struct {
		path, body string
		header     map[string]string
		status     int
	}{
		{"/e2b/sandboxes/sb_nothere/fork", `{"count":0}`, auth, http.StatusBadRequest},
		{"/e2b/sandboxes/" + sb.SandboxID + "/fork", `{"count":-1}`, auth, http.StatusBadRequest},
		{"/e2b/sandboxes/sb_nothere/fork", `{"count":1}`, auth, http.StatusNotFound},
		{"/e2b/sandboxes/" + sb.SandboxID + "/fork", `{"count":2}`, other, http.StatusNotFound},
		{"/e2b/sandboxes/" + sb.SandboxID + "/fork", `{"count":2}`, auth, http.StatusNotImplemented},
		{"/e2b/sandboxes/sb_nothere/pause", ``, auth, http.StatusNotFound},
		{"/e2b/sandboxes/" + sb.SandboxID + "/pause", ``, auth, http.StatusNotImplemented},
	} {
		if resp, b := c.do("POST", tc.path, strings.NewReader(tc.body), tc.header); resp.StatusCode != tc.status {
			t.Errorf("POST %s %s: %d %s, want %d", tc.path, tc.body, resp.StatusCode, b, tc.status)
		}
	}
}
