package httpapi_test

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/httpapi"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// A paused sandbox's files are not changed through the API (409
// `paused`, saying why): a file its code held open, replaced while it was
// paused, made every later resume fail with 500 (CRIU: the file has the
// wrong size), and the client could do nothing but delete the sandbox.
// Read, they are there; resumed, the code's file is as it left it.
func TestPausedFilesNotChanged(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	if _, err := criu.Usable(); err != nil {
		t.Skipf("pausing needs CRIU, not built here (make criu): %v", err)
	}
	parent, err := os.MkdirTemp("", "vivarium-httpapi-pause-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o711); err != nil { // a restore reads its checkpoints as the sandbox's root
		t.Fatal(err)
	}
	b, err := native.New(native.Config{CgroupParent: "vivarium-httpapi-pause-test", UIDBase: native.DefaultUIDBase + 9<<24 + 12<<16,
		UIDRanges: 2, CheckpointDir: filepath.Join(parent, "checkpoints")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	svc := service.New(service.Config{Backend: b})
	srv := httptest.NewServer(httpapi.New(svc, keys{"alice-key": "alice"}, nil))
	t.Cleanup(func() { srv.Close(); svc.Close() })
	alice := client{t, srv.URL, "alice-key"}

	id := alice.json("POST", "/v1/sandboxes", map[string]any{}, 201)["id"].(string)
	alice.json("POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"code": "f = open('held.txt', 'w+')\nf.write('abc')\nf.flush()"}, 200)
	alice.json("POST", "/v1/sandboxes/"+id+"/pause", nil, 200)
	for _, req := range []struct{ method, path string }{
		{"PUT", "/v1/sandboxes/" + id + "/files/held.txt"},
		{"DELETE", "/v1/sandboxes/" + id + "/files/held.txt"},
	} {
		code, body := alice.do(req.method, req.path, []byte("longer than it was"))
		if code != 409 || !strings.Contains(string(body), `"paused"`) || !strings.Contains(string(body), "resumed") {
			t.Errorf("%s %s while paused: %d %s, want 409 paused", req.method, req.path, code, body)
		}
	}
	if code, body := alice.do("GET", "/v1/sandboxes/"+id+"/files/held.txt", nil); code != 200 || string(body) != "abc" {
		t.Errorf("read while paused: %d %q", code, body)
	}
	alice.json("POST", "/v1/sandboxes/"+id+"/resume", nil, 200)
	res := alice.json("POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"code": "f.seek(0); print(f.read())"}, 200)
	if res["stdout"] != "abc\n" {
		t.Errorf("the held file after the resume: %v", res)
	}
	alice.json("PUT", "/v1/sandboxes/"+id+"/files/held.txt", []byte("changed once resumed"), 201)
	alice.json("DELETE", "/v1/sandboxes/"+id, nil, 204)
}
