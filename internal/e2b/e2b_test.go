package e2b

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"strings"
	"sync"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// client speaks to the test server as the SDKs do.
type client struct {
	t    *testing.T
	base string
}

func (c client) do(method, path string, body io.Reader, header map[string]string) (*http.Response, []byte) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

type created struct {
	SandboxID       string `json:"sandboxID"`
	EnvdAccessToken string `json:"envdAccessToken"`
	EnvdVersion     string `json:"envdVersion"`
	TemplateID      string `json:"templateID"`
}

func (c client) create(key, body string) created {
	c.t.Helper()
	resp, b := c.do("POST", "/e2b/v2/sandboxes", strings.NewReader(body), map[string]string{"X-API-Key": key, "Content-Type": "application/json"})
	if resp.StatusCode != http.StatusCreated {
		c.t.Fatalf("create: %d %s", resp.StatusCode, b)
	}
	var out created
	if err := json.Unmarshal(b, &out); err != nil {
		c.t.Fatal(err)
	}
	return out
}

func sandboxHeaders(sb created, port string) map[string]string {
	return map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": port, "X-Access-Token": sb.EnvdAccessToken}
}

func TestControlPlane(t *testing.T) {
	ts, _ := newTestServer(t)
	c := client{t, ts.URL}
	a := c.create("key-a", `{"templateID":"code-interpreter-v1","timeout":120,"metadata":{"k":"v"},"envVars":{"FOO":"bar"},"secure":true,"someNewField":1}`)
	if !strings.HasPrefix(a.SandboxID, "sb_") || a.EnvdAccessToken == "" || a.EnvdVersion != envdVersion || a.TemplateID != "code-interpreter-v1" {
		t.Fatalf("%+v", a)
	}
	auth := map[string]string{"X-API-Key": "key-a"}
	other := map[string]string{"X-API-Key": "key-b"}

	for _, tc := range []struct {
		name, method, path, body string
		header                   map[string]string
		status                   int
		want                     string
	}{
		{"get", "GET", "/e2b/sandboxes/" + a.SandboxID, "", auth, 200, `"metadata":{"k":"v"}`},
		{"get: another key", "GET", "/e2b/sandboxes/" + a.SandboxID, "", other, 404, `not found`},
		{"get: no key", "GET", "/e2b/sandboxes/" + a.SandboxID, "", nil, 401, `API key is required`},
		{"get: bad key", "GET", "/e2b/sandboxes/" + a.SandboxID, "", map[string]string{"X-API-Key": "nope"}, 401, `"code":401`},
		{"bearer", "GET", "/e2b/sandboxes/" + a.SandboxID, "", map[string]string{"Authorization": "Bearer key-a"}, 200, a.SandboxID},
		{"list", "GET", "/e2b/v2/sandboxes?metadata=k%3Dv", "", auth, 200, a.SandboxID},
		{"list: filtered out", "GET", "/e2b/v2/sandboxes?metadata=k%3Dw", "", auth, 200, `[]`},
		{"list: paused", "GET", "/e2b/v2/sandboxes?state=paused", "", auth, 200, `[]`},
		{"list: another key", "GET", "/e2b/sandboxes", "", other, 200, `[]`},
		{"timeout", "POST", "/e2b/sandboxes/" + a.SandboxID + "/timeout", `{"timeout":300}`, auth, 204, ``},
		{"timeout: none", "POST", "/e2b/sandboxes/" + a.SandboxID + "/timeout", `{}`, auth, 400, `required`},
		{"timeout: negative", "POST", "/e2b/sandboxes/" + a.SandboxID + "/timeout", `{"timeout":-1}`, auth, 400, `positive`},
		{"timeout: another key", "POST", "/e2b/sandboxes/" + a.SandboxID + "/timeout", `{"timeout":300}`, other, 404, ``},
		{"refresh", "POST", "/e2b/sandboxes/" + a.SandboxID + "/refreshes", `{"duration":60}`, auth, 204, ``},
		{"connect", "POST", "/e2b/v2/sandboxes/" + a.SandboxID + "/connect", `{"timeout":60}`, auth, 200, `"envdAccessToken":"` + a.EnvdAccessToken},
		{"connect: another key", "POST", "/e2b/v2/sandboxes/" + a.SandboxID + "/connect", `{}`, other, 404, ``},
		{"pause", "POST", "/e2b/sandboxes/" + a.SandboxID + "/pause", `{}`, auth, 501, `cannot be paused`},
		{"templates", "GET", "/e2b/templates", "", auth, 501, `templates`},
		{"bad json", "POST", "/e2b/v2/sandboxes", `{`, auth, 400, `invalid JSON`},
		{"custom template without an image store", "POST", "/e2b/v2/sandboxes", `{"templateID":"mine"}`, auth, 501, `keeps no templates`},
		{"internet, as the Python SDK asks by default", "POST", "/e2b/v2/sandboxes", `{"allow_internet_access":true}`, auth, 201, `sandboxID`},
		{"no internet is fine", "POST", "/e2b/v2/sandboxes", `{"allow_internet_access":false,"network":{"denyOut":["0.0.0.0/0"]}}`, auth, 201, `sandboxID`},
		{"egress", "POST", "/e2b/v2/sandboxes", `{"network":{"egressProxy":{"address":"p:1"}}}`, auth, 501, `network settings`},
		{"autopause", "POST", "/e2b/v2/sandboxes", `{"autoPause":true}`, auth, 501, `cannot be paused`},
		{"mcp", "POST", "/e2b/v2/sandboxes", `{"mcp":{"x":{}}}`, auth, 501, `MCP`},
		{"volumes", "POST", "/e2b/v2/sandboxes", `{"volumeMounts":[{"name":"v","path":"/data"}]}`, auth, 501, `volumes`},
		{"timeout too long", "POST", "/e2b/v2/sandboxes", `{"timeout":100000000}`, auth, 400, `over the server's limit`},
	} {
		resp, b := c.do(tc.method, tc.path, strings.NewReader(tc.body), tc.header)
		if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.want) {
			t.Errorf("%s: %d %s; want %d with %q", tc.name, resp.StatusCode, b, tc.status, tc.want)
		}
		if resp.StatusCode >= 400 && !strings.Contains(string(b), fmt.Sprintf(`"code":%d`, resp.StatusCode)) {
			t.Errorf("%s: error body %s lacks its code", tc.name, b)
		}
	}

	// Pages of one.
	c.create("key-a", `{}`)
	resp, b := c.do("GET", "/e2b/v2/sandboxes?limit=1", nil, auth)
	next := resp.Header.Get("X-Next-Token")
	if resp.StatusCode != 200 || next == "" || strings.Count(string(b), "sandboxID") != 1 {
		t.Fatalf("first page: %d %q %s", resp.StatusCode, next, b)
	}

	if resp, b := c.do("DELETE", "/e2b/sandboxes/"+a.SandboxID, nil, other); resp.StatusCode != 404 {
		t.Fatalf("delete with another key: %d %s", resp.StatusCode, b)
	}
	if resp, _ := c.do("DELETE", "/e2b/sandboxes/"+a.SandboxID, nil, auth); resp.StatusCode != 204 {
		t.Fatalf("delete: %d", resp.StatusCode)
	}
	if resp, _ := c.do("DELETE", "/e2b/sandboxes/"+a.SandboxID, nil, auth); resp.StatusCode != 404 {
		t.Fatalf("delete again: %d", resp.StatusCode)
	}
	// Its token opens nothing now.
	if resp, b := c.do("GET", "/e2b/sandbox/health", nil, sandboxHeaders(a, envdPort)); resp.StatusCode != 502 {
		t.Fatalf("health of a killed sandbox: %d %s", resp.StatusCode, b)
	}
}

func TestMetadataFilter(t *testing.T) {
	// The SDK encodes each key and value, then the pairs as a query.
	got, err := metadataFilter("user%2Fid=a%20b&k=v%3Dw")
	if err != nil || got["user/id"] != "a b" || got["k"] != "v=w" || len(got) != 2 {
		t.Fatalf("%v %v", got, err)
	}
	if got, err := metadataFilter(""); err != nil || got != nil {
		t.Fatalf("%v %v", got, err)
	}
	lq := listQuery{metadata: map[string]string{"a": "1"}}
	if !lq.matches(service.Info{Metadata: map[string]string{"a": "1", "b": "2"}}, "base") || lq.matches(service.Info{Metadata: map[string]string{}}, "base") {
		t.Fatal("matches")
	}
}

func TestErrorMapping(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, c := range []struct {
		err    error
		status int
		code   string
	}{
		{service.ErrNotFound, 404, codeUnavailable},
		{fmt.Errorf("x: %w", fs.ErrNotExist), 404, codeNotFound},
		{sandbox.ErrNoContext, 404, codeNotFound},
		{service.ErrNoProcess, 404, codeNotFound},
		{sandbox.ErrBadPath, 400, codeInvalidArgument},
		{sandbox.ErrInvalidSpec, 400, codeInvalidArgument},
		{sandbox.ErrExists, 409, codeAlreadyExists},
		{sandbox.ErrTooLarge, 507, codeResourceExhausted},
		{service.ErrQuota, 429, codeResourceExhausted},
		{errUser, 403, codePermissionDenied},
		{errUnsupported, 501, codeUnimplemented},
		{sandbox.ErrUnsupported, 501, codeUnimplemented},
		{sandbox.ErrClosed, 502, codeUnavailable},
		{service.ErrShuttingDown, 503, codeUnavailable},
		{errors.New("open /var/lib/secret: boom"), 500, codeInternal},
	} {
		status, msg := httpStatus(log, c.err)
		code, msg2 := connectCode(log, c.err)
		if status != c.status || code != c.code {
			t.Errorf("%v: status %d code %s; want %d %s", c.err, status, code, c.status, c.code)
		}
		if c.status == 500 && (strings.Contains(msg, "/var/lib") || strings.Contains(msg2, "/var/lib")) {
			t.Errorf("an internal error leaks its details: %q %q", msg, msg2)
		}
	}
	if code, msg := connectCode(log, newConnectError(codeDeadlineExceeded, "slow")); code != codeDeadlineExceeded || msg != "slow" {
		t.Errorf("a connect error keeps its code: %s %s", code, msg)
	}
}

// rpc calls a unary Connect method with JSON.
func (c client) rpc(sb created, method, body string, header map[string]string) (int, map[string]any) {
	c.t.Helper()
	h := sandboxHeaders(sb, envdPort)
	h["Content-Type"] = "application/json"
	h["Connect-Protocol-Version"] = "1"
	for k, v := range header {
		h[k] = v
	}
	resp, b := c.do("POST", "/e2b/sandbox/"+method, strings.NewReader(body), h)
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		c.t.Fatalf("%s: %d %q is not JSON", method, resp.StatusCode, b)
	}
	return resp.StatusCode, out
}

// stream calls a server-streaming Connect method and returns its messages
// and the end of the stream.
func (c client) stream(sb created, method, body string, header map[string]string) ([]map[string]any, map[string]any) {
	c.t.Helper()
	h := sandboxHeaders(sb, envdPort)
	h["Content-Type"] = "application/connect+json"
	for k, v := range header {
		h[k] = v
	}
	var env bytes.Buffer
	env.WriteByte(0)
	binary.Write(&env, binary.BigEndian, uint32(len(body)))
	env.WriteString(body)
	resp, b := c.do("POST", "/e2b/sandbox/"+method, &env, h)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/connect+json" {
		c.t.Fatalf("%s: %d %s %q", method, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	var msgs []map[string]any
	for len(b) >= 5 {
		flags, n := b[0], binary.BigEndian.Uint32(b[1:5])
		var m map[string]any
		if err := json.Unmarshal(b[5:5+n], &m); err != nil {
			c.t.Fatal(err)
		}
		b = b[5+n:]
		if flags&flagEndStream != 0 {
			if len(b) != 0 {
				c.t.Fatalf("%s: bytes after the end of the stream", method)
			}
			return msgs, m
		}
		msgs = append(msgs, m)
	}
	c.t.Fatalf("%s: no end of stream", method)
	return nil, nil
}

func TestEnvd(t *testing.T) {
	ts, _ := newTestServer(t)
	c := client{t, ts.URL}
	sb := c.create("key-a", `{"envVars":{"FOO":"from-create"}}`)
	peer := c.create("key-a", `{}`)

	// Auth and routing.
	for _, tc := range []struct {
		name   string
		header map[string]string
		status int
	}{
		{"no token", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": envdPort}, 401},
		{"token of another sandbox", map[string]string{"E2b-Sandbox-Id": peer.SandboxID, "E2b-Sandbox-Port": envdPort, "X-Access-Token": sb.EnvdAccessToken}, 401},
		{"no such sandbox", map[string]string{"E2b-Sandbox-Id": "sb_other", "E2b-Sandbox-Port": envdPort, "X-Access-Token": sb.EnvdAccessToken}, 502},
		{"traffic token", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": envdPort, "E2B-Traffic-Access-Token": sb.EnvdAccessToken}, 204},
		{"no port", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "X-Access-Token": sb.EnvdAccessToken}, 400},
		{"another port", sandboxHeaders(sb, "8080"), 502},
		{"ok", sandboxHeaders(sb, envdPort), 204},
	} {
		if resp, b := c.do("GET", "/e2b/sandbox/health", nil, tc.header); resp.StatusCode != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.name, resp.StatusCode, b, tc.status)
		}
	}

	// Files: a multipart upload of two files (paths in the part names,
	// which Part.FileName would cut), a raw one, then reads.
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, f := range []struct{ name, data string }{{"/home/user/d/one.txt", "1"}, {"two.txt", "22"}} {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename=%q`, f.name))
		w, _ := mw.CreatePart(h)
		io.WriteString(w, f.data)
	}
	mw.Close()
	h := sandboxHeaders(sb, envdPort)
	h["Content-Type"] = mw.FormDataContentType()
	resp, b := c.do("POST", "/e2b/sandbox/files", &body, h)
	if resp.StatusCode != 200 || string(b) != `[{"name":"one.txt","type":"file","path":"/home/user/d/one.txt"},{"name":"two.txt","type":"file","path":"/home/user/two.txt"}]`+"\n" {
		t.Fatalf("multipart upload: %d %s", resp.StatusCode, b)
	}
	h["Content-Type"] = "application/octet-stream"
	if resp, b := c.do("POST", "/e2b/sandbox/files?path=/workspace/raw.bin", strings.NewReader("raw"), h); resp.StatusCode != 200 {
		t.Fatalf("raw upload: %d %s", resp.StatusCode, b)
	}
	for _, tc := range []struct {
		path   string
		status int
		want   string
	}{
		{"/home/user/d/one.txt", 200, "1"},
		{"two.txt", 200, "22"},
		{"/home/user/raw.bin", 200, "raw"},
		{"/home/user/missing", 404, `"code":404`},
		{"/home/user/d", 400, `not a regular file`},
		{"/etc/passwd", 400, `outside the sandbox's home`},
		{"/home/user/../../etc/passwd", 400, `outside`},
	} {
		resp, b := c.do("GET", "/e2b/sandbox/files?path="+tc.path, nil, sandboxHeaders(sb, envdPort))
		if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.want) {
			t.Errorf("read %s: %d %s; want %d %q", tc.path, resp.StatusCode, b, tc.status, tc.want)
		}
	}
	if resp, b := c.do("GET", "/e2b/sandbox/files?path=two.txt&username=root", nil, sandboxHeaders(sb, envdPort)); resp.StatusCode != 403 {
		t.Errorf("read as root: %d %s", resp.StatusCode, b)
	}
	h = sandboxHeaders(sb, envdPort)
	h["X-Metadata-Owner"] = "me"
	if resp, b := c.do("POST", "/e2b/sandbox/files?path=m.txt", strings.NewReader("x"), h); resp.StatusCode != 200 ||
		!strings.Contains(string(b), `"metadata":{"owner":"me"}`) {
		t.Errorf("file metadata: %d %s", resp.StatusCode, b)
	}
	h["X-Metadata-"] = "x" // an empty key
	if resp, b := c.do("POST", "/e2b/sandbox/files?path=m2.txt", strings.NewReader("x"), h); resp.StatusCode != 400 {
		t.Errorf("bad metadata key: %d %s", resp.StatusCode, b)
	}
	delete(h, "X-Metadata-")
	h["X-Metadata-Big"] = strings.Repeat("v", sandbox.MaxMetadataValueLen+1)
	if resp, b := c.do("POST", "/e2b/sandbox/files?path=m2.txt", strings.NewReader("x"), h); resp.StatusCode != 400 {
		t.Errorf("metadata over its bound: %d %s", resp.StatusCode, b)
	}

	// The Filesystem service.
	for _, tc := range []struct {
		method, body string
		header       map[string]string
		status       int
		want         string
	}{
		{"filesystem.Filesystem/Stat", `{"path":"/home/user/two.txt"}`, nil, 200, `"type":"FILE_TYPE_FILE"`},
		{"filesystem.Filesystem/Stat", `{"path":"/home/user/two.txt"}`, nil, 200, `"size":"2"`},
		{"filesystem.Filesystem/Stat", `{"path":"/home/user/none"}`, nil, 404, `"code":"not_found"`},
		{"filesystem.Filesystem/Stat", `{"path":"/etc"}`, nil, 400, `"code":"invalid_argument"`},
		{"filesystem.Filesystem/Stat", `{"path":1}`, nil, 400, `invalid request message`},
		{"filesystem.Filesystem/Stat", `{"path":"two.txt"}`, map[string]string{"Authorization": "Basic cm9vdDo="}, 403, `"code":"permission_denied"`},
		{"filesystem.Filesystem/Stat", `{"path":"two.txt"}`, map[string]string{"Authorization": "Basic dXNlcjo="}, 200, `two.txt`},
		{"filesystem.Filesystem/MakeDir", `{"path":"/home/user/new/dir"}`, nil, 200, `"type":"FILE_TYPE_DIRECTORY"`},
		{"filesystem.Filesystem/MakeDir", `{"path":"/home/user/new/dir"}`, nil, 409, `"code":"already_exists"`},
		{"filesystem.Filesystem/Move", `{"source":"two.txt","destination":"/home/user/new/moved.txt"}`, nil, 200, `"path":"/home/user/new/moved.txt"`},
		{"filesystem.Filesystem/Move", `{"source":"two.txt","destination":"x"}`, nil, 404, `not_found`},
		{"filesystem.Filesystem/ListDir", `{"path":"/home/user","depth":1}`, nil, 200, `"name":"new"`},
		{"filesystem.Filesystem/ListDir", `{"path":"/home/user","depth":"3"}`, nil, 200, `/home/user/new/dir`},
		{"filesystem.Filesystem/ListDir", `{"path":"/home/user/raw.bin"}`, nil, 400, `not a directory`},
		{"filesystem.Filesystem/Remove", `{"path":"/home/user/new"}`, nil, 200, `{}`},
		{"filesystem.Filesystem/Remove", `{"path":"/home/user/new"}`, nil, 200, `{}`}, // gone already: envd succeeds too
		{"filesystem.Filesystem/Remove", `{"path":"/home/user"}`, nil, 400, `cannot be removed`},
		{"process.Process/List", `{}`, nil, 200, `"processes":[]`},
		{"process.Process/SendSignal", `{"process":{"pid":7},"signal":"SIGNAL_SIGKILL"}`, nil, 404, `not_found`},
		{"process.Process/SendSignal", `{"process":{"pid":7},"signal":"SIGNAL_SIGHUP"}`, nil, 400, `SIGKILL or SIGTERM`},
		{"process.Process/Update", `{"process":{"pid":7},"pty":{"size":{"cols":80,"rows":24}}}`, nil, 404, `not_found`},
		{"process.Process/Update", `{"process":{"pid":7},"pty":{"size":{"cols":0,"rows":24}}}`, nil, 400, `1 to 4096 rows`},
		{"process.Process/SendInput", `{"process":{"pid":7},"input":{"pty":"aGk="}}`, nil, 404, `not_found`},
	} {
		status, out := c.rpc(sb, tc.method, tc.body, tc.header)
		b, _ := json.Marshal(out)
		if status != tc.status || !strings.Contains(string(b), tc.want) {
			t.Errorf("%s %s: %d %s; want %d %q", tc.method, tc.body, status, b, tc.status, tc.want)
		}
	}
	// Watchers polled by the client report what changed between calls.
	status, out := c.rpc(sb, "filesystem.Filesystem/CreateWatcher", `{"path":"/home/user","recursive":true}`, nil)
	if status != 200 || out["watcherId"] == nil {
		t.Fatalf("create watcher: %d %v", status, out)
	}
	wid := fmt.Sprintf(`{"watcherId":%q}`, out["watcherId"])
	h = sandboxHeaders(sb, envdPort)
	h["Content-Type"] = "application/octet-stream"
	c.do("POST", "/e2b/sandbox/files?path=/home/user/watched/new.txt", strings.NewReader("x"), h)
	status, out = c.rpc(sb, "filesystem.Filesystem/GetWatcherEvents", wid, nil)
	if b, _ := json.Marshal(out); status != 200 || string(b) != `{"events":[{"name":"watched","type":"EVENT_TYPE_CREATE"},{"name":"watched/new.txt","type":"EVENT_TYPE_CREATE"},{"name":"watched/new.txt","type":"EVENT_TYPE_WRITE"}]}` {
		t.Fatalf("watcher events: %d %s", status, b)
	}
	if status, out = c.rpc(sb, "filesystem.Filesystem/GetWatcherEvents", wid, nil); status != 200 || len(out["events"].([]any)) != 0 {
		t.Fatalf("no change since: %d %v", status, out)
	}
	other := c.create("key-a", `{}`)
	if status, _ := c.rpc(other, "filesystem.Filesystem/GetWatcherEvents", wid, nil); status != 404 {
		t.Fatalf("another sandbox's watcher: %d", status)
	}
	if status, _ := c.rpc(sb, "filesystem.Filesystem/RemoveWatcher", wid, nil); status != 200 {
		t.Fatalf("remove watcher: %d", status)
	}
	if status, _ := c.rpc(sb, "filesystem.Filesystem/GetWatcherEvents", wid, nil); status != 404 {
		t.Fatalf("removed watcher: %d", status)
	}

	// Binary protobuf is refused by name.
	h = sandboxHeaders(sb, envdPort)
	h["Content-Type"] = "application/proto"
	if resp, b := c.do("POST", "/e2b/sandbox/filesystem.Filesystem/Stat", strings.NewReader("\n\x01a"), h); resp.StatusCode != 501 || !strings.Contains(string(b), "JSON messages only") {
		t.Errorf("proto: %d %s", resp.StatusCode, b)
	}

	// The Process service: a command's events, then its end.
	msgs, end := c.stream(sb, "process.Process/Start",
		`{"process":{"cmd":"/bin/bash","args":["-l","-c","exit 3"],"envs":{"BAR":"1"},"cwd":"sub"},"stdin":false}`, nil)
	if len(end) != 0 {
		t.Fatalf("end of stream: %v", end)
	}
	var stdout, stderr string
	for _, m := range msgs {
		ev := m["event"].(map[string]any)
		if d, ok := ev["data"].(map[string]any); ok {
			if s, ok := d["stdout"].(string); ok {
				stdout += decode64(t, s)
			}
			if s, ok := d["stderr"].(string); ok {
				stderr += decode64(t, s)
			}
		}
	}
	first := msgs[0]["event"].(map[string]any)["start"].(map[string]any)
	last := msgs[len(msgs)-1]["event"].(map[string]any)["end"].(map[string]any)
	if first["pid"] != 42.0 || last["exitCode"] != 3.0 || last["status"] != "exit status 3" ||
		stdout != `argv=["/bin/bash" "-l" "-c" "exit 3"] FOO=from-create dir=/home/user/sub`+"\n" || stderr != "exiting 3\n" {
		t.Fatalf("start: %v %v %q %q", first, last, stdout, stderr)
	}
	_, end = c.stream(sb, "process.Process/Start", `{"process":{"cmd":"true","cwd":"/missing"}}`, nil)
	if e := end["error"].(map[string]any); e["code"] != codeInvalidArgument || !strings.Contains(e["message"].(string), "chdir /missing") {
		t.Fatalf("start in a missing directory: %v", end)
	}
	_, end = c.stream(sb, "process.Process/Start", `{"process":{"cmd":"bash"},"pty":{"size":{"cols":80,"rows":24}}}`, nil)
	// The size reaches the backend (the fake has no terminals).
	if e := end["error"].(map[string]any); e["code"] != codeUnimplemented || !strings.Contains(e["message"].(string), "24x80") {
		t.Fatalf("pty: %v", end)
	}
	_, end = c.stream(sb, "process.Process/Start", `{"process":{"cmd":"bash"},"pty":{"size":{"cols":80,"rows":70000}}}`, nil)
	if e := end["error"].(map[string]any); e["code"] != codeInvalidArgument {
		t.Fatalf("pty too tall: %v", end)
	}
	_, end = c.stream(sb, "process.Process/Connect", `{"process":{"pid":4242}}`, nil)
	if e := end["error"].(map[string]any); e["code"] != codeNotFound {
		t.Fatalf("connect to nothing: %v", end)
	}
	// A timeout ends the command (the fake sleeps until killed).
	_, end = c.stream(sb, "process.Process/Start", `{"process":{"cmd":"sh","args":["-c","sleep"]}}`, map[string]string{"Connect-Timeout-Ms": "200"})
	if e := end["error"].(map[string]any); e["code"] != codeDeadlineExceeded {
		t.Fatalf("timeout: %v", end)
	}
}

func decode64(t *testing.T, s string) string {
	var b pbBytes
	if err := b.UnmarshalJSON([]byte(`"` + s + `"`)); err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestProtoJSONTypes(t *testing.T) {
	for _, in := range []string{`"aGk/Pg=="`, `"aGk/Pg"`, `"aGk_Pg"`, `"aGk_Pg=="`} {
		var b pbBytes
		if err := json.Unmarshal([]byte(in), &b); err != nil || string(b) != "hi?>" {
			t.Errorf("bytes %s: %q %v", in, b, err)
		}
	}
	var bad pbBytes
	if json.Unmarshal([]byte(`"!!"`), &bad) == nil {
		t.Error("invalid base64 accepted")
	}
	for _, in := range []string{`7`, `"7"`} {
		var u pbUint32
		if err := json.Unmarshal([]byte(in), &u); err != nil || u != 7 {
			t.Errorf("uint32 %s: %d %v", in, u, err)
		}
	}
	var u pbUint32
	if json.Unmarshal([]byte(`-1`), &u) == nil || json.Unmarshal([]byte(`4294967296`), &u) == nil {
		t.Error("out-of-range uint32 accepted")
	}
	if b, _ := json.Marshal(pbInt64(1 << 40)); string(b) != `"1099511627776"` {
		t.Errorf("int64: %s", b)
	}
	for in, want := range map[string]string{`"SIGNAL_SIGKILL"`: "killed", `9`: "killed", `"SIGTERM"`: "terminated", `15`: "terminated"} {
		if sig, err := signalOf(json.RawMessage(in)); err != nil || sig.String() != want {
			t.Errorf("signal %s: %v %v", in, sig, err)
		}
	}
	var sel selectorRequest
	if err := json.Unmarshal([]byte(`{"process":{"tag":"web"}}`), &sel); err != nil || sel.Process.Selector.Tag == nil || *sel.Process.Selector.Tag != "web" {
		t.Errorf("selector: %+v %v", sel, err)
	}
}

func TestInterpreter(t *testing.T) {
	ts, _ := newTestServer(t)
	c := client{t, ts.URL}
	sb := c.create("key-a", `{}`)
	h := sandboxHeaders(sb, interpreterPort)
	h["Content-Type"] = "application/json"
	resp, b := c.do("POST", "/e2b/sandbox/execute", strings.NewReader(`{"code":"out hello\nerr oops\nresult 'quoted'\nenv X\nraise ValueError","env_vars":{"X":"from-env"}}`), h)
	if resp.StatusCode != 200 {
		t.Fatalf("execute: %d %s", resp.StatusCode, b)
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	types := []string{}
	for _, m := range lines {
		types = append(types, m["type"].(string))
	}
	if strings.Join(types, ",") != "stdout,stderr,result,stdout,error,number_of_executions" {
		t.Fatalf("lines: %v", lines)
	}
	if r := lines[2]; r["text"] != "quoted" || r["html"] != "<b>'quoted'</b>" || r["is_main_result"] != true || r["json"].(map[string]any)["a"] != 1.0 {
		t.Errorf("result: %v", r)
	}
	if lines[3]["text"] != "from-env\n" || lines[4]["name"] != "ValueError" || lines[5]["execution_count"] != 1.0 {
		t.Errorf("lines: %v", lines)
	}
	// The fake backend has no contexts: said with the status the SDK
	// shows (its messages come from 404 bodies only).
	for _, tc := range []struct {
		method, path, body string
		status             int
		want               string
	}{
		{"POST", "/e2b/sandbox/execute", `{"code":"1","language":"cobol"}`, 404, `language "cobol" is not available`},
		{"POST", "/e2b/sandbox/execute", `{"code":"1","context_id":"nope"}`, 404, `context "nope" not found`},
		{"POST", "/e2b/sandbox/execute", `{"code":`, 400, `invalid execution request`},
		{"POST", "/e2b/sandbox/contexts", `{"language":"cobol"}`, 404, `not available`},
		{"GET", "/e2b/sandbox/contexts", ``, 501, `no code contexts`},
		{"GET", "/e2b/sandbox/nothing", ``, 404, `not part of the code interpreter's API`},
	} {
		resp, b := c.do(tc.method, tc.path, strings.NewReader(tc.body), h)
		if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.want) {
			t.Errorf("%s %s %s: %d %s; want %d %q", tc.method, tc.path, tc.body, resp.StatusCode, b, tc.status, tc.want)
		}
	}
}

func TestResultLine(t *testing.T) {
	m := resultLine(sandbox.Output{Text: "'a string'", PNG: "iVBOR", IsMainResult: false})
	if m["text"] != "a string" || m["png"] != "iVBOR" || m["is_main_result"] != false || m["type"] != "result" {
		t.Errorf("%v", m)
	}
	if _, ok := m["html"]; ok {
		t.Error("empty formats are left out")
	}
	if m := resultLine(sandbox.Output{Text: "'"}); m["text"] != "'" {
		t.Errorf("a lone quote: %v", m)
	}
}

// Executions sent while another runs wait their turn, as a kernel queues
// cells; a sandbox's queue and watches are bounded.
func TestExecutionsQueue(t *testing.T) {
	ts, _ := newTestServer(t)
	c := client{t, ts.URL}
	sb := c.create("key-a", `{}`)
	h := sandboxHeaders(sb, interpreterPort)
	var wg sync.WaitGroup
	outs := make([]string, 3)
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, b := c.do("POST", "/e2b/sandbox/execute", strings.NewReader(fmt.Sprintf(`{"code":"sleep 100\nout %d"}`, i)), h)
			outs[i] = string(b)
		}()
	}
	wg.Wait()
	for i, out := range outs {
		if !strings.Contains(out, fmt.Sprintf(`"text":"%d\n"`, i)) || strings.Contains(out, `"type":"error"`) {
			t.Errorf("execution %d: %s", i, out)
		}
	}

	s := New(Config{Prefix: "/e2b"})
	var releases []func()
	for range maxWatchesPerSandbox {
		r, ok := s.hold("watch", "sb_1", maxWatchesPerSandbox)
		if !ok {
			t.Fatal("refused within the bound")
		}
		releases = append(releases, r)
	}
	if _, ok := s.hold("watch", "sb_1", maxWatchesPerSandbox); ok {
		t.Fatal("held past the bound")
	}
	if r, ok := s.hold("watch", "sb_2", maxWatchesPerSandbox); !ok {
		t.Fatal("another sandbox's bound is its own")
	} else {
		r()
	}
	releases[0]()
	releases[0]() // twice is once
	if _, ok := s.hold("watch", "sb_1", maxWatchesPerSandbox); !ok {
		t.Fatal("a release did not free a place")
	}
	if _, ok := s.hold("watch", "sb_1", maxWatchesPerSandbox); ok {
		t.Fatal("a double release freed two places")
	}
}
