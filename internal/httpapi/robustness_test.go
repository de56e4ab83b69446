package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/vivarium-sandbox/vivarium/internal/httpapi"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"github.com/vivarium-sandbox/vivarium/internal/workspace"
)

// fakeBackend makes sandboxes without isolation, for tests of the HTTP
// layer alone: decoding, routing, errors. Their workspace is a real
// confined directory; Execute echoes the code, or blocks on "block".
type fakeBackend struct{ dir string }

func (f *fakeBackend) Name() string { return "fake" }

func (f *fakeBackend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	d, err := os.MkdirTemp(f.dir, "ws")
	if err != nil {
		return nil, err
	}
	ws, err := workspace.Open(d, os.Getuid(), os.Getgid())
	if err != nil {
		return nil, err
	}
	return &fakeSandbox{ws: ws, release: make(chan struct{})}, nil
}

type fakeSandbox struct {
	ws      *workspace.Dir
	mu      sync.Mutex
	busy    bool
	release chan struct{}
}

func (s *fakeSandbox) ID() string { return "fake" }
func (s *fakeSandbox) Execute(ctx context.Context, req sandbox.ExecRequest, sink sandbox.Sink) (*sandbox.Result, error) {
	s.mu.Lock()
	if s.busy {
		s.mu.Unlock()
		return nil, sandbox.ErrBusy
	}
	s.busy = true
	s.mu.Unlock()
	defer func() { s.mu.Lock(); s.busy = false; s.mu.Unlock() }()
	if req.Code == "block" {
		select {
		case <-s.release:
		case <-ctx.Done():
		}
	}
	if sink != nil {
		sink.Stdout([]byte(req.Code))
	}
	return &sandbox.Result{Status: sandbox.StatusOK, Stdout: req.Code, Results: []sandbox.Output{}}, nil
}
func (s *fakeSandbox) Interrupt() error {
	select {
	case s.release <- struct{}{}:
	default:
	}
	return nil
}
func (s *fakeSandbox) Restart(context.Context) error { return nil }
func (s *fakeSandbox) Start(context.Context, sandbox.Command) (sandbox.Process, error) {
	return nil, fmt.Errorf("%w: no commands in the fake", sandbox.ErrUnsupported)
}
func (s *fakeSandbox) Workspace() sandbox.Workspace { return s.ws }
func (s *fakeSandbox) Close() error                 { return s.ws.Close() }

// fakeServer serves the API over fake sandboxes, and fails the test if a
// handler panics (net/http would otherwise recover and hide it).
func fakeServer(t testing.TB, cfg service.Config) (*httptest.Server, *service.Service) {
	t.Helper()
	cfg.Backend = &fakeBackend{dir: t.TempDir()}
	svc := service.New(cfg)
	api := httpapi.New(svc, keys{"alice-key": "alice", "bob-key": "bob"}, nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				t.Errorf("handler panicked on %s %s: %v", r.Method, r.URL, p)
				panic(p)
			}
		}()
		api.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { srv.Close(); svc.Close() })
	return srv, svc
}

// Every error is JSON with a code and a message written for the caller:
// no Go error chains, no stack traces, no internal paths.
func checkErrorBody(t testing.TB, what string, code int, body []byte, sent ...string) {
	t.Helper()
	if code < 400 {
		return
	}
	var e struct {
		Error struct{ Code, Message string }
	}
	if code == 404 && !bytes.HasPrefix(body, []byte("{")) {
		return // the mux's own "404 page not found" for unknown routes
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
		t.Errorf("%s: %d with a body that is not a JSON error: %q", what, code, body)
	}
	// What the client sent may come back quoted: not a leak.
	text := e.Error.Message
	for _, s := range echoes(sent) {
		text = strings.ReplaceAll(text, s, "")
	}
	for _, leak := range []string{"goroutine ", "panic", "/tmp/", "/proc/", "/run/", ".go:", "json: ", "Go struct", "Go value"} {
		if strings.Contains(text, leak) {
			t.Errorf("%s: the error shows internals (%q): %s", what, leak, body)
		}
	}
}

// echoes are the strings a client sent, as an error message may quote
// them: the request's path, its body, and every string in the body's JSON,
// raw and quoted; longest first.
func echoes(sent []string) []string {
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case string:
			out = append(out, v, strconv.Quote(v), fmt.Sprintf("%q", v))
		case map[string]any:
			for k, x := range v {
				walk(k)
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	for _, s := range sent {
		walk(s)
		var v any
		if json.Unmarshal([]byte(s), &v) == nil {
			walk(v)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return slices.DeleteFunc(out, func(s string) bool { return s == "" })
}

func TestBadInputGetsClearErrors(t *testing.T) {
	srv, _ := fakeServer(t, service.Config{})
	c := client{t, srv.URL, "alice-key"}
	id := c.json("POST", "/v1/sandboxes", nil, 201)["id"].(string)
	base := "/v1/sandboxes/" + id
	cases := []struct {
		method, path string
		body         any
		want         int
	}{
		{"POST", base + "/execute", []byte("{not json"), 400},
		{"POST", base + "/execute", []byte(`{"code": 1}`), 400},
		{"POST", base + "/execute", []byte(`{"code": "1"} {"code": "2"}`), 400},
		{"POST", base + "/execute", []byte("[]"), 400},
		{"POST", base + "/execute", []byte("{\"code\": \"\xff\xfe\"}"), 200}, // invalid UTF-8 is replaced, not fatal
		{"POST", base + "/execute", map[string]any{"code": "1", "timeout_s": -1}, 400},
		{"POST", base + "/execute", map[string]any{"code": "1", "timeout_s": 1e9}, 400},
		{"POST", base + "/execute", map[string]any{"code": "1", "env": map[string]string{"A=B": "x"}}, 400},
		{"POST", base + "/execute", map[string]any{"code": "1", "env": map[string]string{"A": "x\x00y"}}, 400},
		{"POST", base + "/execute", []byte(`{"code": "` + strings.Repeat("x", 33<<20) + `"}`), 413},
		{"POST", "/v1/sandboxes/sb_nope/execute", map[string]any{"code": "1"}, 404},
		{"GET", "/v1/sandboxes/sb_nope", nil, 404},
		{"DELETE", "/v1/sandboxes/sb_nope", nil, 404},
		{"GET", "/v1/sandboxes/" + strings.Repeat("a", 10000), nil, 404},
		{"POST", "/v1/sandboxes", map[string]any{"timeout_s": -5}, 400},
		{"POST", "/v1/sandboxes", map[string]any{"timeout_s": 1e12}, 400},
		{"POST", "/v1/sandboxes", map[string]any{"limits": map[string]any{"pids": -1}}, 400},
		{"POST", "/v1/sandboxes", map[string]any{"limits": map[string]any{"memory": "lots"}}, 400},
		{"POST", "/v1/sandboxes", map[string]any{"metadata": map[string]string{strings.Repeat("k", 300): "v"}}, 400},
		{"POST", base + "/timeout", map[string]any{"timeout_s": 0}, 400},
		{"GET", base + "/files?depth=x", nil, 400},
		{"GET", base + "/files?depth=1000", nil, 400},
		{"GET", base + "/files/missing.txt", nil, 404},
		{"GET", base + "/files?path=../..", nil, 400},
		{"GET", base + "/files/" + strings.Repeat("n", 256), nil, 400},
		{"PUT", base + "/files/d/f", []byte("x"), 201},
		{"GET", base + "/files/d/f/x", nil, 400},     // through a file: was a 500
		{"DELETE", base + "/files/d/f/x", nil, 400},  // was a 500
		{"PUT", base + "/files/d", []byte("x"), 409}, // over a directory: was a 500
		{"DELETE", base + "/files/a/" + strings.Repeat("n", 256), nil, 400},
		{"PUT", base + "/files/%2e%2e/escape", []byte("x"), 400},
		{"PUT", base + "/files/a/../../escape", []byte("x"), 404}, // the mux cleans the path: no such route
		{"DELETE", base + "/files/.", nil, 400},
		{"POST", base + "/commands", map[string]any{"cmd": ""}, 400},
		{"POST", "/v1/execute", map[string]any{"code": "1", "files": map[string]string{"a": "not base64!"}}, 400},
		{"POST", "/v1/execute", map[string]any{"code": "1", "limits": map[string]any{"disk": 1}}, 400},
	}
	for _, tc := range cases {
		code, body := c.do(tc.method, tc.path, tc.body)
		what := tc.method + " " + tc.path
		if len(what) > 80 {
			what = what[:80]
		}
		if code != tc.want {
			t.Errorf("%s: %d, want %d: %.200s", what, code, tc.want, body)
		}
		checkErrorBody(t, what, code, body)
	}
}

// A second execution while one runs is refused with 409, and the quota of
// executions at once per key gives 429.
func TestBusyAndExecutionQuota(t *testing.T) {
	srv, svc := fakeServer(t, service.Config{MaxExecutionsPerOwner: 2})
	c := client{t, srv.URL, "alice-key"}
	a := c.json("POST", "/v1/sandboxes", nil, 201)["id"].(string)
	b := c.json("POST", "/v1/sandboxes", nil, 201)["id"].(string)
	x := c.json("POST", "/v1/sandboxes", nil, 201)["id"].(string)
	var wg sync.WaitGroup
	for _, id := range []string{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.json("POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"code": "block"}, 200)
		}()
	}
	waitRunning := func(id string) {
		for range 500 {
			info, _ := svc.Info("alice", id)
			if info.State == "running" {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("%s never ran", id)
	}
	waitRunning(a)
	waitRunning(b)
	code, body := c.do("POST", "/v1/sandboxes/"+a+"/execute", map[string]any{"code": "1"})
	if code != 409 {
		t.Errorf("execute in a busy sandbox: %d %s", code, body)
	}
	checkErrorBody(t, "busy", code, body)
	code, body = c.do("POST", "/v1/sandboxes/"+x+"/execute", map[string]any{"code": "1"})
	if code != 429 || !strings.Contains(string(body), "2 executions at once") {
		t.Errorf("third execution at once: %d %s", code, body)
	}
	// Another key is not held back by alice's quota.
	bob := client{t, srv.URL, "bob-key"}
	y := bob.json("POST", "/v1/sandboxes", nil, 201)["id"].(string)
	bob.json("POST", "/v1/sandboxes/"+y+"/execute", map[string]any{"code": "1"}, 200)
	c.json("POST", "/v1/sandboxes/"+a+"/interrupt", nil, 200)
	c.json("POST", "/v1/sandboxes/"+b+"/interrupt", nil, 200)
	wg.Wait()
	c.json("POST", "/v1/sandboxes/"+x+"/execute", map[string]any{"code": "1"}, 200)
}

// Shutdown refuses new work with 503, lets the running execution end
// (here: interrupted when the grace period is over), and closes every
// sandbox.
func TestShutdownDrains(t *testing.T) {
	srv, svc := fakeServer(t, service.Config{})
	c := client{t, srv.URL, "alice-key"}
	id := c.json("POST", "/v1/sandboxes", nil, 201)["id"].(string)
	other := c.json("POST", "/v1/sandboxes", nil, 201)["id"].(string)
	done := make(chan int)
	go func() {
		code, _ := c.do("POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"code": "block"})
		done <- code
	}()
	for range 500 {
		if info, _ := svc.Info("alice", id); info.State == "running" {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	shut := make(chan error)
	go func() { shut <- svc.Shutdown(ctx) }()
	testutil.WaitFor(t, 10*time.Second, "an execution refused by the shutdown", func() bool {
		code, _ := c.do("POST", "/v1/sandboxes/"+other+"/execute", map[string]any{"code": "1"})
		return code == 503
	})
	code, body := c.do("POST", "/v1/sandboxes", nil)
	if code != 503 {
		t.Errorf("create while shutting down: %d %s", code, body)
	}
	if code := <-done; code != 200 {
		t.Errorf("the running execution ended with %d", code)
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	if svc.Live() != 0 {
		t.Fatalf("%d sandboxes left", svc.Live())
	}
}

// fuzzBodies are bad request bodies: wrong JSON, wrong types, and bad
// values of every field a route decodes.
var fuzzBodies = []string{
	"", "{}", "null", "[]", `"x"`, "{", `{"a":}`, "\xff\xfe", `{"unknown":1}`, `{"code":"1"} {"code":"2"}`,
	`{"code": "print(1)"}`, `{"code":1}`, `{"code":"\u0000"}`,
	`{"timeout_s": -1}`, `{"timeout_s": 1e300}`, `{"timeout_s": -1e300}`, `{"timeout_s": 1e-300}`, `{"timeout_s":"5"}`,
	`{"cpu_time_s": 1e300}`, `{"max_lifetime_s": 1e300}`,
	`{"limits": {"memory": 1e30}}`, `{"limits": {"memory": -1}}`, `{"limits": {"memory": 1.5}}`, `{"limits": {"memory": "lots"}}`,
	`{"limits": {"pids": 1e12}}`, `{"limits": {"cpus": -1}}`, `{"limits": {"disk": 1}}`, `{"limits": {"max_output": -1}}`,
	`{"limits": []}`, `{"limits": null}`,
	`{"files": {"../x": "AA=="}}`, `{"files": {"/etc/x": "AA=="}}`, `{"files": {"": "AA=="}}`, `{"files": {"a\u0000": "AA=="}}`,
	`{"files": {"a": "not base64!"}}`, `{"files": []}`,
	`{"env": {"": ""}}`, `{"env": {"A=B": "x"}}`, `{"env": {"A": "x\u0000y"}}`, `{"env": {"A": 1}}`, `{"env": []}`,
	`{"env": {"A": "` + strings.Repeat("v", 70000) + `"}}`,
	`{"cmd": ""}`, `{"cmd": "pwd", "cwd": "/missing"}`, `{"cmd": "pwd", "cwd": "relative"}`, `{"cmd": "pwd", "cwd": "a\u0000b"}`,
	`{"cmd": "pwd", "cwd": "/` + strings.Repeat("d", 5000) + `"}`, `{"cmd": "a\u0000b"}`, `{"cmd": "` + strings.Repeat("x", 70000) + `"}`,
	`{"cmd": "true", "stdin": "yes"}`, `{"signal": "SIGSTOP"}`, `{"signal": 9}`,
	`{"language": "cobol"}`, `{"language": "python", "cwd": "rel"}`, `{"context": "nope"}`,
	`{"backend": "nope"}`, `{"network": "yes"}`, `{"network": {"allow": ["x"]}}`, `{"metadata": {"k": 1}}`,
	`{"name": ""}`, `{"name": "../x", "version": "\u0000"}`,
}

// FuzzRequests sends arbitrary methods, paths, content types and bodies to
// every route: the server never panics, never answers a client's input with
// a server error (5xx; 501 is the fake's lack of commands), and answers
// every error with JSON written for the client (no Go error chain, no
// internal path).
func FuzzRequests(f *testing.F) {
	routes := []string{"/v1/sandboxes", "/v1/sandboxes/ID", "/v1/sandboxes/ID/execute", "/v1/sandboxes/ID/timeout",
		"/v1/sandboxes/ID/commands", "/v1/sandboxes/ID/files", "/v1/sandboxes/ID/files/a/b.txt", "/v1/execute",
		"/v1/sandboxes/ID/interrupt", "/v1/sandboxes/ID/restart", "/v1/sandboxes/ID/processes", "/v1/sandboxes/ID/contexts",
		"/v1/sandboxes/ID/processes/1/signal", "/v1/sandboxes/ID/processes/x/stdin", "/v1/sandboxes/ID/packages",
		"/v1/sandboxes/ID/contexts/nope/restart"}
	for _, r := range routes {
		for _, body := range fuzzBodies {
			f.Add("POST", r, "application/json", body)
		}
		f.Add("GET", r, "", "")
		f.Add("DELETE", r, "", "")
		f.Add("PUT", r, "text/plain", "x")
		f.Add("POST", r, "application/x-www-form-urlencoded", "code=1")
	}
	f.Add("PUT", "/v1/sandboxes/ID/files/../../etc/passwd", "", "x")
	f.Add("PUT", "/v1/sandboxes/ID/files/%2e%2e/x", "", "x")
	f.Add("PUT", "/v1/sandboxes/ID/files/a%00b", "", "x")
	f.Add("GET", "/v1/sandboxes/ID/files?path=%00&depth=99999999999999999999", "", "")
	f.Add("GET", "/v1/sandboxes/ID/files?path=/etc&depth=-1", "", "")
	f.Add("GET", "/v1/sandboxes/"+strings.Repeat("a", 5000), "", "")
	f.Add("GET", "/v1/sandboxes/ID/files/"+strings.Repeat("n", 256), "", "") // over NAME_MAX: was a 500
	f.Add("PUT", "/v1/sandboxes/ID/files/a/"+strings.Repeat("n", 256), "", "x")
	srv, _ := fakeServer(f, service.Config{MaxPerOwner: 1000})
	c := &http.Client{Timeout: 10 * time.Second}
	var idOnce sync.Once
	var id string
	f.Fuzz(func(t *testing.T, method, path, contentType, body string) {
		idOnce.Do(func() {
			resp, err := doRaw(c, srv.URL, "POST", "/v1/sandboxes", "", "")
			if err != nil {
				t.Fatal(err)
			}
			var info struct{ ID string }
			json.NewDecoder(resp.Body).Decode(&info)
			resp.Body.Close()
			id = info.ID
		})
		if !utf8.ValidString(method) || strings.ContainsAny(method, " \t\r\n") || method == "" || len(method) > 16 {
			return
		}
		if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \r\n\t#") {
			return
		}
		if strings.ContainsAny(contentType, "\r\n\x00") {
			return
		}
		path = strings.ReplaceAll(path, "ID", id)
		resp, err := doRaw(c, srv.URL, method, path, contentType, body)
		if err != nil {
			return // the client refused to send it
		}
		out, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if resp.StatusCode >= 500 && resp.StatusCode != 501 {
			t.Errorf("%s %s %q: %d %s", method, path, body, resp.StatusCode, out)
		}
		if resp.StatusCode != 405 {
			checkErrorBody(t, method+" "+path, resp.StatusCode, out, body, path)
		}
	})
}

func doRaw(c *http.Client, base, method, path, contentType, body string) (*http.Response, error) {
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer alice-key")
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return c.Do(req)
}

// namedFake is a fake backend under another name.
type namedFake struct {
	fakeBackend
	name string
}

func (f *namedFake) Name() string { return f.name }

// A client chooses the backend of a sandbox among those the server
// offers; another is refused with the list.
func TestChoosingABackend(t *testing.T) {
	dir := t.TempDir()
	mux := sandbox.NewMux(&fakeBackend{dir: dir}, &namedFake{fakeBackend{dir: dir}, "second"})
	svc := service.New(service.Config{Backend: mux, Backends: mux.Names()})
	t.Cleanup(func() { svc.Close() })
	srv := httptest.NewServer(httpapi.New(svc, keys{"alice-key": "alice"}, nil))
	t.Cleanup(srv.Close)
	for _, c := range []struct {
		path, body, want string
		code             int
	}{
		{"/v1/sandboxes", `{}`, `"backend":"fake"`, 201},
		{"/v1/sandboxes", `{"backend":"second"}`, `"backend":"second"`, 201},
		{"/v1/sandboxes", `{"backend":"docker"}`, `backend \"docker\" is not offered here; this server offers fake, second`, 400},
		{"/v1/execute", `{"code":"x","backend":"second"}`, `"stdout":"x"`, 200},
		{"/v1/execute", `{"code":"x","backend":"gvisor"}`, `is not offered here`, 400},
	} {
		resp, err := doRaw(srv.Client(), srv.URL, "POST", c.path, "application/json", c.body)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code || !strings.Contains(string(body), c.want) {
			t.Errorf("POST %s %s: %d %s; want %d with %s", c.path, c.body, resp.StatusCode, body, c.code, c.want)
		}
	}
}
