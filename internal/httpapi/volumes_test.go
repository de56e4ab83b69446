package httpapi_test

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/httpapi"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"github.com/vivarium-sandbox/vivarium/internal/volume"
)

// volumeServer is a server with volumes kept in dir; stop ends it as a
// server's shutdown does (sandboxes, then volumes).
type volumeServer struct {
	srv  *httptest.Server
	svc  *service.Service
	vols *volume.Store
}

func newVolumeServer(t *testing.T, b *native.Backend, dir string) *volumeServer {
	t.Helper()
	vols, err := volume.Open(volume.Config{Dir: dir, MaxSize: 64 << 20, DefaultSize: 32 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if err := vols.Unavailable(); err != nil {
		t.Skipf("volumes unavailable: %v", err)
	}
	svc := service.New(service.Config{Backend: b, MaxPerOwner: 3, Volumes: vols})
	vs := &volumeServer{srv: httptest.NewServer(httpapi.New(svc, keys{"alice-key": "alice", "bob-key": "bob"}, nil)),
		svc: svc, vols: vols}
	t.Cleanup(vs.stop)
	return vs
}

func (v *volumeServer) stop() {
	v.srv.Close()
	v.svc.Close()
	v.vols.Close()
}

func volumeBackend(t *testing.T) *native.Backend {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	b, err := native.New(native.Config{CgroupParent: "vivarium-httpapi-vol-test", UIDBase: native.DefaultUIDBase + 9<<24 + 8<<16,
		UIDRanges: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// leftovers lists what of the volumes in dir is still mounted or
// attached to a loop device.
func leftovers(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, dir) {
			out = append(out, "mount: "+l)
		}
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), dir) {
			out = append(out, "loop: "+f)
		}
	}
	return out
}

func TestVolumesAPI(t *testing.T) {
	b := volumeBackend(t)
	dir := filepath.Join(t.TempDir(), "volumes")
	vs := newVolumeServer(t, b, dir)
	alice := client{t, vs.srv.URL, "alice-key"}
	bob := client{t, vs.srv.URL, "bob-key"}

	for _, name := range []string{"../x", "/", "a/b", "..", strings.Repeat("n", 64), ""} {
		alice.json("POST", "/v1/volumes", map[string]any{"name": name}, 400)
	}
	alice.json("POST", "/v1/volumes", map[string]any{"name": "huge", "size": 1 << 30}, 400)
	v := alice.json("POST", "/v1/volumes", map[string]any{"name": "data"}, 201)
	id := v["id"].(string)
	if v["size"] != float64(32<<20) || v["name"] != "data" {
		t.Fatalf("%v", v)
	}
	alice.json("POST", "/v1/volumes", map[string]any{"name": "data"}, 409)
	alice.json("GET", "/v1/volumes/data", nil, 200)
	if l := alice.json("GET", "/v1/volumes", nil, 200)["volumes"].([]any); len(l) != 1 {
		t.Fatalf("%v", l)
	}

	// Bob: nothing of alice's, by ID or name.
	for _, ref := range []string{id, "data"} {
		bob.json("GET", "/v1/volumes/"+ref, nil, 404)
		bob.json("DELETE", "/v1/volumes/"+ref, nil, 404)
		bob.json("GET", "/v1/volumes/"+ref+"/files", nil, 404)
		bob.json("PUT", "/v1/volumes/"+ref+"/files/x", []byte("x"), 404)
		bob.json("POST", "/v1/sandboxes", map[string]any{"volumes": []map[string]string{{"name": ref, "path": "/home/user/data"}}}, 404)
	}
	if l := bob.json("GET", "/v1/volumes", nil, 200)["volumes"].([]any); len(l) != 0 {
		t.Fatalf("bob lists %v", l)
	}
	for _, p := range []string{"/etc", "/", "relative", "/home/user/../../etc", "/proc/x"} {
		alice.json("POST", "/v1/sandboxes", map[string]any{"volumes": []map[string]string{{"name": "data", "path": p}}}, 400)
	}

	// Files in before any sandbox; a sandbox sees them and writes, and
	// plants links pointing out.
	alice.json("PUT", "/v1/volumes/data/files/in/hello.txt", []byte("from the API"), 201)
	sb := alice.json("POST", "/v1/sandboxes", map[string]any{"home": "/home/user",
		"volumes": []map[string]string{{"name": "data", "path": "/home/user/data"}}}, 201)
	sbID := sb["id"].(string)
	if m := sb["volumes"].([]any); len(m) != 1 || m[0].(map[string]any)["path"] != "/home/user/data" {
		t.Fatalf("volumes of the sandbox: %v", sb["volumes"])
	}
	res := alice.json("POST", "/v1/sandboxes/"+sbID+"/execute", map[string]any{"code": `import os
print(open("/home/user/data/in/hello.txt").read())
open("/home/user/data/out.txt", "w").write("from the sandbox")
os.symlink("/etc/shadow", "/home/user/data/shadow")
os.symlink("../../../../../../etc/passwd", "/home/user/data/in/up")`}, 200)
	if res["stdout"] != "from the API\n" {
		t.Fatalf("%v", res)
	}
	// The sandbox's file API reaches into the volume, as its user, and
	// follows none of its links either.
	alice.json("PUT", "/v1/sandboxes/"+sbID+"/files/data/via-sandbox-api.txt", []byte("through the sandbox"), 201)
	if code, body := alice.do("GET", "/v1/volumes/data/files/via-sandbox-api.txt", nil); code != 200 || string(body) != "through the sandbox" {
		t.Fatalf("file written through the sandbox's API: %d %q", code, body)
	}
	if code, body := alice.do("GET", "/v1/sandboxes/"+sbID+"/files/data/out.txt", nil); code != 200 || string(body) != "from the sandbox" {
		t.Fatalf("read through the sandbox's API: %d %q", code, body)
	}
	if code, body := alice.do("GET", "/v1/sandboxes/"+sbID+"/files/data/shadow", nil); code != 400 {
		t.Fatalf("read through a link with the sandbox's API: %d %s", code, body)
	}
	if code, _ := alice.do("DELETE", "/v1/sandboxes/"+sbID+"/files/data", nil); code != 400 {
		t.Fatalf("removed the mount point: %d", code)
	}
	// In use: not deleted.
	if code, body := alice.do("DELETE", "/v1/volumes/data", nil); code != 409 || !strings.Contains(string(body), "in_use") {
		t.Fatalf("delete in use: %d %s", code, body)
	}
	// Links are refused by the content API, never followed.
	for _, p := range []string{"shadow", "in/up"} {
		if code, body := alice.do("GET", "/v1/volumes/data/files/"+p, nil); code != 400 {
			t.Fatalf("GET %s through a link: %d %s", p, code, body)
		}
	}
	if code, _ := alice.do("PUT", "/v1/volumes/data/files/in/up/x", []byte("x")); code == 201 {
		t.Fatal("wrote through a link")
	}
	alice.json("DELETE", "/v1/sandboxes/"+sbID, nil, 204)

	// A server restart: the volume and its files are there.
	vs.stop()
	testutil.WaitFor(t, 10*time.Second, "nothing of the volume left after the server stopped",
		func() bool { return len(leftovers(t, dir)) == 0 })
	vs = newVolumeServer(t, b, dir)
	alice = client{t, vs.srv.URL, "alice-key"}
	if code, body := alice.do("GET", "/v1/volumes/data/files/out.txt", nil); code != 200 || string(body) != "from the sandbox" {
		t.Fatalf("after restart: %d %q", code, body)
	}
	sb = alice.json("POST", "/v1/sandboxes", map[string]any{"volumes": []map[string]string{{"name": id, "path": "/mnt/v"}}}, 201)
	res = alice.json("POST", "/v1/sandboxes/"+sb["id"].(string)+"/execute", map[string]any{"code": `print(open("/mnt/v/out.txt").read())`}, 200)
	if res["stdout"] != "from the sandbox\n" {
		t.Fatalf("%v", res)
	}
	alice.json("DELETE", "/v1/sandboxes/"+sb["id"].(string), nil, 204)
	// The kernel lets go of a dead sandbox's mounts a moment after it.
	testutil.WaitFor(t, 10*time.Second, "nothing of the volume left after the last sandbox ended",
		func() bool { return len(leftovers(t, dir)) == 0 })
	alice.json("DELETE", "/v1/volumes/data", nil, 204)
	alice.json("GET", "/v1/volumes/data", nil, 404)
}

// The file APIs reach a volume as the sandbox's user, whichever way in:
// what the sandbox's root keeps to itself in a volume (a 0600 file in a
// 0700 directory) is 403 through the sandbox's files and the volume's,
// as it is to the sandbox's user in the sandbox.
func TestVolumeFilesAsSandboxUser(t *testing.T) {
	b := volumeBackend(t)
	vs := newVolumeServer(t, b, filepath.Join(t.TempDir(), "volumes"))
	alice := client{t, vs.srv.URL, "alice-key"}
	alice.json("POST", "/v1/volumes", map[string]any{"name": "data"}, 201)
	sb := alice.json("POST", "/v1/sandboxes", map[string]any{
		"volumes": []map[string]string{{"name": "data", "path": "/workspace/data"}}}, 201)
	id := sb["id"].(string)
	// The user lets its root in (the volume's root is the user's); the
	// root keeps a directory of its own there.
	for _, c := range []map[string]any{
		{"cmd": "mkdir -m 777 /workspace/data/shared && chmod 777 /workspace/data/shared"},
		{"user": "root", "cmd": "cd /workspace/data/shared && mkdir -m 700 private && echo root-only > private/secret && " +
			"chmod 600 private/secret && echo for-all > public"},
	} {
		if res := alice.json("POST", "/v1/sandboxes/"+id+"/commands", c, 200); res["exit_code"] != float64(0) {
			t.Fatalf("%v: %v", c, res)
		}
	}
	res := alice.json("POST", "/v1/sandboxes/"+id+"/commands", map[string]any{"cmd": "cat /workspace/data/shared/private/secret"}, 200)
	if res["exit_code"] == float64(0) {
		t.Fatalf("the sandbox's user read its root's secret: %v", res)
	}
	for _, p := range []string{"/v1/sandboxes/" + id + "/files/data/shared/private/secret",
		"/v1/volumes/data/files/shared/private/secret", "/v1/volumes/data/files?path=shared/private",
		"/v1/sandboxes/" + id + "/files?path=data/shared/private"} {
		if code, body := alice.do("GET", p, nil); code != 403 {
			t.Errorf("GET %s: %d %s, want 403", p, code, body)
		}
	}
	for _, p := range []string{"/v1/sandboxes/" + id + "/files/data/shared/public", "/v1/volumes/data/files/shared/public"} {
		if code, body := alice.do("GET", p, nil); code != 200 || string(body) != "for-all\n" {
			t.Errorf("GET %s: %d %q", p, code, body)
		}
	}
	alice.json("DELETE", "/v1/sandboxes/"+id, nil, 204)
}
