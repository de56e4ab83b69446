package httpapi_test

import (
	"strings"
	"testing"
)

// Bad input that only a real sandbox can tell is bad (a working directory
// that is not there, a file where a directory should be), and input over
// what a sandbox's processes can be given, is the client's mistake: a 4xx
// whose message says what to change, never a 500 or a closed sandbox.
func TestBadCommandInputIsTheClients(t *testing.T) {
	srv, _ := newServer(t)
	c := client{t, srv.URL, "alice-key"}
	id := c.json("POST", "/v1/sandboxes", nil, 201)["id"].(string)
	base := "/v1/sandboxes/" + id
	c.json("POST", base+"/commands", map[string]any{"cmd": "mkdir -p data && touch afile"}, 200)
	big := strings.Repeat("v", 70<<10)
	for _, tc := range []struct {
		path string
		body map[string]any
		code int
		want string // in the message
	}{
		{"/commands", map[string]any{"cmd": "pwd", "cwd": "/nonexistent"}, 400, "working directory /nonexistent"},
		{"/commands", map[string]any{"cmd": "pwd", "cwd": "/workspace/afile"}, 400, "not a directory"},
		{"/commands", map[string]any{"cmd": "pwd", "cwd": "missing"}, 400, "working directory /workspace/missing"},
		{"/commands", map[string]any{"cmd": "pwd", "cwd": "a\x00b"}, 400, "NUL byte"},
		{"/commands", map[string]any{"cmd": "pwd", "cwd": "/" + strings.Repeat("d", 5000)}, 400, "over the limit"},
		{"/commands", map[string]any{"cmd": "pwd", "env": map[string]string{"A": big}}, 400, "pass large data in a file"},
		{"/commands", map[string]any{"cmd": "a\x00b"}, 400, "NUL byte"},
		{"/commands", map[string]any{"cmd": "echo " + big}, 400, "write a long script to a file"},
		{"/commands", map[string]any{"cmd": "true", "timeout_s": 1e300}, 400, "over the server's limit"},
		{"/processes", map[string]any{"cmd": "pwd", "cwd": "/nonexistent"}, 400, "working directory /nonexistent"},
		{"/processes", map[string]any{"cmd": "pwd", "cwd": "a\x00b"}, 400, "NUL byte"},
		{"/execute", map[string]any{"code": "1", "env": map[string]string{"A": big}}, 400, "pass large data in a file"},
		{"/execute", map[string]any{"code": "1", "timeout_s": 1e300}, 400, "over the server's limit"},
	} {
		code, body := c.do("POST", base+tc.path, tc.body)
		if code != tc.code || !strings.Contains(string(body), tc.want) {
			t.Errorf("%s %.120v: %d %.300s; want %d with %q", tc.path, tc.body, code, body, tc.code, tc.want)
		}
		checkErrorBody(t, tc.path, code, body)
	}
	// A relative working directory is the workspace's.
	res := c.json("POST", base+"/commands", map[string]any{"cmd": "pwd", "cwd": "data"}, 200)
	if res["stdout"] != "/workspace/data\n" {
		t.Errorf("cwd data: %v", res)
	}
	// The sandbox is still there and works after all of that.
	if res := c.json("POST", base+"/execute", map[string]any{"code": "6*7"}, 200); res["status"] != "ok" {
		t.Errorf("after bad input: %v", res)
	}

	for _, tc := range []struct {
		path string
		body map[string]any
		want string
	}{
		{"/v1/sandboxes", map[string]any{"env": map[string]string{"A": big}}, "pass large data in a file"},
		{"/v1/execute", map[string]any{"code": "1", "timeout_s": -5}, "timeout"},
		{"/v1/execute", map[string]any{"code": "1", "env": map[string]string{"A": "\x00"}}, "NUL byte"},
		{"/v1/execute", map[string]any{"code": "1", "files": map[string]string{"../x": "AA=="}}, "leaves the workspace"},
		{"/v1/execute", map[string]any{"code": "1", "files": map[string]string{"/etc/x": "AA=="}}, "is absolute"},
		{"/v1/sandboxes", map[string]any{"limits": map[string]any{"memory": 1e30}}, "limits.memory: expected an integer in range, got number 1e+30"},
		{"/v1/sandboxes", map[string]any{"network": "yes"}, "network: expected an object, got a string"},
	} {
		code, body := c.do("POST", tc.path, tc.body)
		if code != 400 || !strings.Contains(string(body), tc.want) {
			t.Errorf("%s %.120v: %d %.300s; want 400 with %q", tc.path, tc.body, code, body, tc.want)
		}
		checkErrorBody(t, tc.path, code, body)
	}
}
