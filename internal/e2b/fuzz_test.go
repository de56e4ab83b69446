package e2b

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// fuzzRoute is a request E2B's SDKs make, whose body the fuzzer writes.
type fuzzRoute struct {
	method, path string
	// port is the data plane's (envd, interpreter); "" is the control
	// plane.
	port string
	// kind: "json" (control plane, interpreter), "unary" or "stream"
	// (Connect), "raw" (a file's bytes), "query" (the body is the path
	// query parameter).
	kind string
}

var fuzzRoutes = []fuzzRoute{
	{"POST", "/e2b/v2/sandboxes", "", "json"},
	{"POST", "/e2b/sandboxes/ID/timeout", "", "json"},
	{"POST", "/e2b/sandboxes/ID/refreshes", "", "json"},
	{"POST", "/e2b/v2/sandboxes/ID/connect", "", "json"},
	{"GET", "/e2b/v2/sandboxes?metadata=", "", "query"},
	{"POST", "/e2b/sandbox/filesystem.Filesystem/Stat", envdPort, "unary"},
	{"POST", "/e2b/sandbox/filesystem.Filesystem/MakeDir", envdPort, "unary"},
	{"POST", "/e2b/sandbox/filesystem.Filesystem/Move", envdPort, "unary"},
	{"POST", "/e2b/sandbox/filesystem.Filesystem/ListDir", envdPort, "unary"},
	{"POST", "/e2b/sandbox/filesystem.Filesystem/Remove", envdPort, "unary"},
	{"POST", "/e2b/sandbox/filesystem.Filesystem/CreateWatcher", envdPort, "unary"},
	{"POST", "/e2b/sandbox/filesystem.Filesystem/GetWatcherEvents", envdPort, "unary"},
	{"POST", "/e2b/sandbox/filesystem.Filesystem/RemoveWatcher", envdPort, "unary"},
	{"POST", "/e2b/sandbox/process.Process/List", envdPort, "unary"},
	{"POST", "/e2b/sandbox/process.Process/SendInput", envdPort, "unary"},
	{"POST", "/e2b/sandbox/process.Process/SendSignal", envdPort, "unary"},
	{"POST", "/e2b/sandbox/process.Process/CloseStdin", envdPort, "unary"},
	{"POST", "/e2b/sandbox/process.Process/Update", envdPort, "unary"},
	{"POST", "/e2b/sandbox/process.Process/Start", envdPort, "stream"},
	{"POST", "/e2b/sandbox/process.Process/Connect", envdPort, "stream"},
	{"POST", "/e2b/sandbox/filesystem.Filesystem/WatchDir", envdPort, "stream"},
	{"GET", "/e2b/sandbox/files?path=", envdPort, "query"},
	{"POST", "/e2b/sandbox/files?path=", envdPort, "query"},
	{"POST", "/e2b/sandbox/execute", interpreterPort, "json"},
	{"POST", "/e2b/sandbox/contexts", interpreterPort, "json"},
}

// fuzzSeeds are bad inputs, by the kind of route.
var fuzzSeeds = []string{
	``, `{}`, `null`, `[]`, `"x"`, `{`, `{"a":}`, "\xff\xfe", `{"unknown": 1}`,
	// Paths: relative, up, NUL, huge, outside the home, a link's name.
	`{"path":"../../etc/passwd"}`, `{"path":"/etc/passwd"}`, `{"path":"a\u0000b"}`, `{"path":"` + strings.Repeat("a", 5000) + `"}`,
	`{"path":""}`, `{"path":"/home/user/.."}`, `{"path":"` + strings.Repeat("n", 256) + `"}`, `{"path":1}`, `{"path":["a"]}`, `{"source":"a","destination":"../b"}`,
	`{"path":"/home/user","depth":-1}`, `{"path":"/home/user","depth":1e30}`, `{"path":"/home/user","depth":"x"}`,
	// Processes: cwd, env, args of every wrong kind.
	`{"process":{"cmd":"sh","args":["-c","true"],"cwd":"/missing"}}`,
	`{"process":{"cmd":"sh","cwd":"a\u0000b"}}`, `{"process":{"cmd":"sh","cwd":"` + strings.Repeat("d/", 3000) + `"}}`,
	`{"process":{"cmd":"sh","envs":{"A=B":"x"}}}`, `{"process":{"cmd":"sh","envs":{"A":"x\u0000y"}}}`,
	`{"process":{"cmd":"sh","envs":{"A":"` + strings.Repeat("v", 70000) + `"}}}`, `{"process":{"cmd":"sh","envs":[]}}`,
	`{"process":{"cmd":""}}`, `{"process":{"cmd":"a\u0000b"}}`, `{"process":{"cmd":"sh","args":[1]}}`, `{"process":null}`,
	`{"process":{"cmd":"sh"},"pty":{"size":{"rows":1}}}`, `{"process":{"cmd":"sh"},"stdin":"yes"}`, `{"process":{"cmd":"sh"},"tag":5}`,
	`{"process":{"selector":{"pid":-1}}}`, `{"process":{"pid":4294967296}}`, `{"process":{"pid":"x"}}`, `{"process":{"tag":"nope"}}`,
	`{"process":{"pid":42},"signal":"SIGNAL_SIGKILL"}`, `{"process":{"pid":42},"signal":99}`, `{"process":{"pid":42},"input":{"stdin":"!!"}}`,
	`{"process":{"pid":42},"pty":{"size":{"cols":-1}}}`, `{"watcherId":"../x"}`, `{"watcherID":1}`,
	// The control plane.
	`{"templateID":"../x"}`, `{"timeout":-1}`, `{"timeout":9223372036854775807}`, `{"timeout":18446744074}`, `{"timeout":1.5}`,
	`{"timeout":"x"}`, `{"envVars":{"A":"\u0000"}}`, `{"envVars":{"":"x"}}`, `{"metadata":{"k":1}}`, `{"duration":-5}`,
	`k=v`, `k`, `=`, `%zz`,
	// The interpreter.
	`{"code":"out hi","language":"cobol"}`, `{"code":"out hi","context_id":"nope"}`, `{"code":1}`,
	`{"code":"env A","env_vars":{"A=":"x"}}`, `{"code":"x","env_vars":{"A":"` + strings.Repeat("v", 70000) + `"}}`,
	`{"language":"python","cwd":"rel"}`, `{"language":"python","cwd":"a\u0000"}`, `{"language":"bash","cwd":"/missing"}`,
}

// FuzzAPI sends arbitrary bodies to every request of E2B's API that
// carries one: the answer is never a server error (a 5xx but 501, or
// Connect's internal), never a panic, and never shows a Go error chain
// or a host path.
func FuzzAPI(f *testing.F) {
	for i, r := range fuzzRoutes {
		for _, s := range fuzzSeeds {
			if r.kind == "query" && len(s) > 200 {
				continue
			}
			f.Add(uint8(i), false, []byte(s))
		}
	}
	f.Add(uint8(18), true, []byte("\x00\x00\x00\x00\xff"))   // an envelope longer than its body
	f.Add(uint8(18), true, []byte("\x01\x00\x00\x00\x02{}")) // "compressed", but not
	f.Add(uint8(18), true, []byte("\x00\xff\xff\xff\xff"))   // 4 GiB
	ts, _ := newTestServer(f)
	c := &http.Client{Timeout: 20 * time.Second}
	var once sync.Once
	var sb created
	f.Fuzz(func(t *testing.T, route uint8, raw bool, body []byte) {
		once.Do(func() { sb = fuzzSandbox(t, c, ts.URL) })
		r := fuzzRoutes[int(route)%len(fuzzRoutes)]
		path := strings.ReplaceAll(r.path, "ID", sb.SandboxID)
		var payload []byte
		switch {
		case r.kind == "query":
			path += url.QueryEscape(string(body))
			if r.method == "POST" {
				payload = []byte("content")
			}
		case r.kind == "stream" && !raw:
			payload = binary.BigEndian.AppendUint32([]byte{0}, uint32(len(body)))
			payload = append(payload, body...)
		default:
			payload = body
		}
		req, err := http.NewRequest(r.method, ts.URL+path, bytes.NewReader(payload))
		if err != nil {
			return
		}
		switch r.kind {
		case "unary":
			req.Header.Set("Content-Type", "application/json")
		case "stream":
			req.Header.Set("Content-Type", "application/connect+json")
		case "json":
			req.Header.Set("Content-Type", "application/json")
		}
		req.Header.Set("Connect-Timeout-Ms", "100") // a watch runs until then
		if r.port == "" {
			req.Header.Set("X-API-Key", "key-a")
		} else {
			for k, v := range sandboxHeaders(sb, r.port) {
				req.Header.Set(k, v)
			}
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s %q: %v", r.method, path, body, err)
		}
		out, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		what := r.method + " " + r.path
		if resp.StatusCode >= 500 && resp.StatusCode != http.StatusNotImplemented {
			t.Errorf("%s %.300q: %d %.300s", what, body, resp.StatusCode, out)
		}
		if r.kind == "stream" {
			checkStreamEnd(t, what, body, out)
		}
		var rpc rpcError
		if r.kind == "unary" && json.Unmarshal(out, &rpc) == nil && rpc.Code == codeInternal {
			t.Errorf("%s %.300q: internal: %s", what, body, out)
		}
		checkLeaks(t, what, body, out)
	})
}

// checkStreamEnd checks a Connect stream's end-of-stream message.
func checkStreamEnd(t *testing.T, what string, body, out []byte) {
	t.Helper()
	var end []byte
	for b := out; len(b) >= 5; {
		n := int(binary.BigEndian.Uint32(b[1:5]))
		if 5+n > len(b) {
			t.Errorf("%s %.300q: a truncated message in the stream", what, body)
			return
		}
		if b[0]&flagEndStream != 0 {
			end = b[5 : 5+n]
		}
		b = b[5+n:]
	}
	if end == nil {
		t.Errorf("%s %.300q: the stream has no end: %.300q", what, body, out)
		return
	}
	var e struct{ Error *rpcError }
	if err := json.Unmarshal(end, &e); err != nil {
		t.Errorf("%s %.300q: end of stream %q: %v", what, body, end, err)
	} else if e.Error != nil && e.Error.Code == codeInternal {
		t.Errorf("%s %.300q: internal: %s", what, body, end)
	}
}

// checkLeaks fails when an answer shows what only the server should see.
func checkLeaks(t *testing.T, what string, body, out []byte) {
	t.Helper()
	s := string(out)
	// What the client sent may come back quoted: not a leak.
	s = strings.ReplaceAll(s, string(body), "")
	for _, leak := range []string{"json: ", "Go struct", "Go value", ".go:", "goroutine ", "panic", "/tmp/", "/run/", "/proc/self"} {
		if strings.Contains(s, leak) {
			t.Errorf("%s %.200q: the answer shows %q: %.300s", what, body, leak, out)
		}
	}
}

func fuzzSandbox(t *testing.T, c *http.Client, base string) created {
	req, _ := http.NewRequest("POST", base+"/e2b/v2/sandboxes", strings.NewReader(`{"timeout":3600}`))
	req.Header.Set("X-API-Key", "key-a")
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb created
	if err := json.NewDecoder(resp.Body).Decode(&sb); err != nil || sb.SandboxID == "" {
		t.Fatalf("create: %d %v", resp.StatusCode, err)
	}
	return sb
}
