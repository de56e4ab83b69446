package mcp_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/mcp"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/snapshot"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// The test binary is re-executed as every sandbox's init.
func TestMain(m *testing.M) {
	if native.IsInit() {
		native.RunInit()
	}
	code := m.Run()
	if os.Geteuid() == 0 {
		if left := testutil.CgroupsUnder(cgroupParent); len(left) > 0 {
			println("cgroups left behind:", strings.Join(left, " "))
			code = 1
		}
	}
	os.Exit(code)
}

// This package's own cgroup parent and uid range, apart from the other
// packages' leftover checks.
const (
	cgroupParent = "vivarium-mcp-test"
	uidBase      = native.DefaultUIDBase + 6<<24
)

var (
	backendOnce sync.Once
	backend     *native.Backend
	backendErr  error
)

func newService(t *testing.T) *service.Service {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	backendOnce.Do(func() {
		backend, backendErr = native.New(native.Config{CgroupParent: cgroupParent, UIDBase: uidBase, UIDRanges: testutil.UIDRanges})
	})
	if backendErr != nil {
		t.Fatal(backendErr)
	}
	svc := service.New(service.Config{Backend: backend})
	t.Cleanup(func() { svc.Close() })
	return svc
}

// connect serves an MCP session for owner over in-memory transports, the
// way ServeStdio does over a pipe, and returns the client's end.
func connect(t *testing.T, cfg mcp.Config) *sdk.ClientSession {
	t.Helper()
	st, ct := sdk.NewInMemoryTransports()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mcp.ServeTransport(ctx, cfg, "owner", st) }()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		cancel()
		<-done
	})
	return cs
}

func call(t *testing.T, cs *sdk.ClientSession, tool string, args map[string]any) *sdk.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return res
}

// texts joins the text blocks of a result.
func texts(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
			b.WriteString("\n")
		}
	}
	return b.String()
}

func images(res *sdk.CallToolResult) []*sdk.ImageContent {
	var out []*sdk.ImageContent
	for _, c := range res.Content {
		if ic, ok := c.(*sdk.ImageContent); ok {
			out = append(out, ic)
		}
	}
	return out
}

func mustOK(t *testing.T, res *sdk.CallToolResult) string {
	t.Helper()
	if res.IsError {
		t.Fatalf("tool error: %s", texts(res))
	}
	return texts(res)
}

func TestToolsAreDescribedForAModel(t *testing.T) {
	svc := service.New(service.Config{}) // no backend: nothing runs
	defer svc.Close()
	cs := connect(t, mcp.Config{Service: svc})
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"run_python": true, "run_shell": true, "create_sandbox": true, "close_sandbox": true,
		"list_files": true, "read_file": true, "write_file": true, "fetch_port": true, "run_code": true,
		"pause_sandbox": true, "resume_sandbox": true, "fork_sandbox": true, "snapshot_sandbox": true}
	for _, tool := range res.Tools {
		if !want[tool.Name] {
			t.Errorf("unexpected tool %s", tool.Name)
			continue
		}
		delete(want, tool.Name)
		if len(tool.Description) < 80 {
			t.Errorf("%s: description too short for a model: %q", tool.Name, tool.Description)
		}
		schema := tool.InputSchema.(map[string]any)
		props, _ := schema["properties"].(map[string]any)
		for name, p := range props {
			if d, _ := p.(map[string]any)["description"].(string); d == "" {
				t.Errorf("%s.%s has no description", tool.Name, name)
			}
		}
	}
	for name := range want {
		t.Errorf("tool %s missing", name)
	}
}

func TestRunPythonOneShot(t *testing.T) {
	cs := connect(t, mcp.Config{Service: newService(t)})
	out := mustOK(t, call(t, cs, "run_python", map[string]any{"code": "print('hello')\n6 * 7"}))
	if !strings.Contains(out, "stdout:\nhello\n") || !strings.Contains(out, "result:\n42") {
		t.Fatalf("output: %q", out)
	}
	// Nothing is kept between one-shot runs.
	mustOK(t, call(t, cs, "run_python", map[string]any{"code": "x = 1"}))
	res := call(t, cs, "run_python", map[string]any{"code": "x"})
	if !res.IsError || !strings.Contains(texts(res), "NameError: name 'x' is not defined") {
		t.Fatalf("state leaked between one-shot runs: %s", texts(res))
	}
	// The raw traceback, as Python prints it.
	res = call(t, cs, "run_python", map[string]any{"code": "def f():\n    return 1/0\nf()"})
	tb := texts(res)
	if !res.IsError || !strings.Contains(tb, "Traceback (most recent call last):") || !strings.Contains(tb, "line 2, in f") ||
		!strings.Contains(tb, "ZeroDivisionError: division by zero") {
		t.Fatalf("traceback: %v %q", res.IsError, tb)
	}
	// A limit is an error with its reason.
	res = call(t, cs, "run_python", map[string]any{"code": "while True: pass", "timeout_s": 0.5})
	if !res.IsError || !strings.Contains(texts(res), "timeout") {
		t.Fatalf("timeout: %v %q", res.IsError, texts(res))
	}
	// Nothing printed: the model is told how to see values.
	if out := mustOK(t, call(t, cs, "run_python", map[string]any{"code": "y = 2"})); !strings.Contains(out, "print()") {
		t.Fatalf("empty output: %q", out)
	}
}

func TestStatefulSandboxAndChart(t *testing.T) {
	testutil.RequirePythonModules(t, "matplotlib")
	svc := newService(t)
	cs := connect(t, mcp.Config{Service: svc})
	res := call(t, cs, "create_sandbox", map[string]any{"idle_timeout_s": 120})
	mustOK(t, res)
	id := res.StructuredContent.(map[string]any)["sandbox_id"].(string)
	if !strings.HasPrefix(id, "sb_") || !strings.Contains(texts(res), id) {
		t.Fatalf("create_sandbox: %q %v", texts(res), res.StructuredContent)
	}
	mustOK(t, call(t, cs, "run_python", map[string]any{"code": "import math\nx = 41", "sandbox_id": id}))
	if out := mustOK(t, call(t, cs, "run_python", map[string]any{"code": "x + 1", "sandbox_id": id})); !strings.Contains(out, "Out[2]:\n42") {
		t.Fatalf("state: %q", out)
	}
	res = call(t, cs, "run_python", map[string]any{"sandbox_id": id, "code": `
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [x, 2 * x, 3 * x])
plt.title("chart")
print("drawn")`})
	imgs := images(res)
	if res.IsError || len(imgs) != 1 || imgs[0].MIMEType != "image/png" || !strings.HasPrefix(string(imgs[0].Data), "\x89PNG") {
		t.Fatalf("chart: error %v, %d images, %q", res.IsError, len(imgs), texts(res))
	}
	if out := texts(res); !strings.Contains(out, "drawn") || strings.Contains(out, "<Figure") {
		t.Fatalf("chart text: %q", out)
	}
	if out := mustOK(t, call(t, cs, "run_shell", map[string]any{"command": "echo $((6*7)); pwd", "sandbox_id": id})); !strings.Contains(out, "42\n/workspace") || !strings.Contains(out, "exit code 0") {
		t.Fatalf("run_shell: %q", out)
	}
	mustOK(t, call(t, cs, "close_sandbox", map[string]any{"sandbox_id": id}))
	res = call(t, cs, "run_python", map[string]any{"code": "x", "sandbox_id": id})
	if !res.IsError || !strings.Contains(texts(res), "create_sandbox") {
		t.Fatalf("closed sandbox: %q", texts(res))
	}
	if svc.Live() != 0 {
		t.Fatalf("%d sandboxes live after close_sandbox", svc.Live())
	}
}

func TestRunShellOneShot(t *testing.T) {
	svc := newService(t)
	cs := connect(t, mcp.Config{Service: svc})
	out := mustOK(t, call(t, cs, "run_shell", map[string]any{"command": "id -u; echo err >&2"}))
	if !strings.Contains(out, "stdout:\n1000\n") || !strings.Contains(out, "stderr:\nerr\n") {
		t.Fatalf("run_shell: %q", out)
	}
	res := call(t, cs, "run_shell", map[string]any{"command": "exit 3"})
	if !res.IsError || !strings.Contains(texts(res), "exit code 3") {
		t.Fatalf("exit 3: %v %q", res.IsError, texts(res))
	}
	if svc.Live() != 0 {
		t.Fatalf("the command's sandbox was left: %d live", svc.Live())
	}
}

func TestFiles(t *testing.T) {
	svc := newService(t)
	cs := connect(t, mcp.Config{Service: svc, MaxText: 2000})
	res := call(t, cs, "create_sandbox", nil)
	id := res.StructuredContent.(map[string]any)["sandbox_id"].(string)

	mustOK(t, call(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "data/in.csv", "content": "a,b\n1,2\n"}))
	png := "\x89PNG\r\n\x1a\nnot really"
	mustOK(t, call(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "pic.png", "encoding": "base64",
		"content": base64.StdEncoding.EncodeToString([]byte(png))}))
	out := mustOK(t, call(t, cs, "run_python", map[string]any{"sandbox_id": id,
		"code": "print(open('data/in.csv').read().split()[1])\nopen('big.txt','w').write('x' * 10000)"}))
	if !strings.Contains(out, "1,2") {
		t.Fatalf("the code did not see the file: %q", out)
	}
	out = mustOK(t, call(t, cs, "list_files", map[string]any{"sandbox_id": id}))
	for _, want := range []string{"data/\n", "data/in.csv  (8 bytes)", "pic.png", "big.txt  (10000 bytes)"} {
		if !strings.Contains(out, want) {
			t.Errorf("list_files lacks %q: %q", want, out)
		}
	}
	if out := mustOK(t, call(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "data/in.csv"})); out != "a,b\n1,2\n\n" {
		t.Errorf("read_file: %q", out)
	}
	res = call(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "pic.png"})
	if imgs := images(res); len(imgs) != 1 || string(imgs[0].Data) != png {
		t.Errorf("read_file of a PNG: %+v", res.Content)
	}
	out = mustOK(t, call(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "big.txt"}))
	if len(out) > 2300 || !strings.Contains(out, "bytes of the file dropped") {
		t.Errorf("long file not truncated: %d bytes", len(out))
	}
	for _, bad := range []map[string]any{
		{"sandbox_id": id, "path": "../../etc/passwd"},
		{"sandbox_id": id, "path": "/etc/passwd"},
		{"sandbox_id": id, "path": "missing.txt"},
		{"sandbox_id": "sb_nope", "path": "x"},
	} {
		if res := call(t, cs, "read_file", bad); !res.IsError || strings.Contains(texts(res), "internal") {
			t.Errorf("read_file %v: %v %q", bad, res.IsError, texts(res))
		}
	}
	res = call(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "x", "content": "!!", "encoding": "base64"})
	if !res.IsError || !strings.Contains(texts(res), "base64") {
		t.Errorf("bad base64: %q", texts(res))
	}
	res = call(t, cs, "list_files", map[string]any{"sandbox_id": id, "depth": 99})
	if !res.IsError {
		t.Errorf("depth 99 accepted")
	}
}

func TestLongOutputIsTruncatedWithANote(t *testing.T) {
	cs := connect(t, mcp.Config{Service: newService(t), MaxText: 1000})
	res := call(t, cs, "run_python", map[string]any{"code": "print('a' * 50000 + 'THE END')"})
	out := mustOK(t, res)
	if len(out) > 1300 || !strings.Contains(out, "bytes of stdout dropped") || !strings.Contains(out, "THE END") {
		t.Fatalf("%d bytes: %q", len(out), out)
	}
}

// Config.Limits are the limits of every sandbox the tools create.
func TestConfiguredLimits(t *testing.T) {
	cs := connect(t, mcp.Config{Service: newService(t), Limits: sandbox.Limits{MaxOutput: 100}})
	out := mustOK(t, call(t, cs, "run_python", map[string]any{"code": "print('b' * 1000)"}))
	if !strings.Contains(out, "the sandbox dropped stdout past its output limit") || strings.Count(out, "b") > 150 {
		t.Fatalf("one-shot: %q", out)
	}
	res := call(t, cs, "create_sandbox", nil)
	id := res.StructuredContent.(map[string]any)["sandbox_id"].(string)
	out = mustOK(t, call(t, cs, "run_python", map[string]any{"code": "print('b' * 1000)", "sandbox_id": id}))
	if !strings.Contains(out, "the sandbox dropped stdout past its output limit") {
		t.Fatalf("stateful: %q", out)
	}
}

// When the client ends its session, the sandboxes it created are closed;
// sandboxes it did not create are not.
func TestSessionEndClosesItsSandboxes(t *testing.T) {
	svc := newService(t)
	other, err := svc.Create(context.Background(), service.CreateRequest{Owner: "owner"})
	if err != nil {
		t.Fatal(err)
	}
	st, ct := sdk.NewInMemoryTransports()
	done := make(chan error, 1)
	go func() { done <- mcp.ServeTransport(context.Background(), mcp.Config{Service: svc}, "owner", st) }()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		mustOK(t, call(t, cs, "create_sandbox", nil))
	}
	if n := svc.Live(); n != 3 {
		t.Fatalf("%d live", n)
	}
	cs.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := svc.Live(); n != 1 {
		t.Fatalf("%d sandboxes live after the session ended; want only the one it did not create", n)
	}
	if _, err := svc.Info("owner", other.ID); err != nil {
		t.Fatalf("a sandbox the session did not create was closed: %v", err)
	}
}

type keys map[string]string

func (k keys) Owner(token string) (string, error) {
	if o, ok := k[token]; ok {
		return o, nil
	}
	return "", errors.New("invalid API key")
}

type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

func httpSession(t *testing.T, url, token string) (*sdk.ClientSession, error) {
	t.Helper()
	tr := &sdk.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: bearer{token, http.DefaultTransport}}, MaxRetries: -1}
	return sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), tr, nil)
}

// Over HTTP the key owns the sandboxes: no key, no session; another key
// sees none of them; ending the session closes what it created.
func TestStreamableHTTPWithKeys(t *testing.T) {
	svc := newService(t)
	h := mcp.NewHandler(mcp.Config{Service: svc, SessionTimeout: time.Minute}, keys{"ka": "alice", "kb": "bob"}, "dev")
	ts := httptest.NewServer(h)
	defer ts.Close()
	defer h.Close()

	resp, err := http.Post(ts.URL, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no key: %d", resp.StatusCode)
	}
	if _, err := httpSession(t, ts.URL, "forged"); err == nil {
		t.Fatal("a forged key connected")
	}

	alice, err := httpSession(t, ts.URL, "ka")
	if err != nil {
		t.Fatal(err)
	}
	res := call(t, alice, "create_sandbox", nil)
	id := res.StructuredContent.(map[string]any)["sandbox_id"].(string)
	mustOK(t, call(t, alice, "run_python", map[string]any{"code": "secret = 'alice'", "sandbox_id": id}))
	if out := mustOK(t, call(t, alice, "run_python", map[string]any{"code": "secret", "sandbox_id": id})); !strings.Contains(out, "'alice'") {
		t.Fatalf("state over HTTP: %q", out)
	}
	if len(svc.List("alice")) != 1 {
		t.Fatalf("alice's sandboxes: %v", svc.List("alice"))
	}

	bob, err := httpSession(t, ts.URL, "kb")
	if err != nil {
		t.Fatal(err)
	}
	for tool, args := range map[string]map[string]any{
		"run_python":    {"code": "secret", "sandbox_id": id},
		"close_sandbox": {"sandbox_id": id},
		"list_files":    {"sandbox_id": id},
	} {
		res := call(t, bob, tool, args)
		if !res.IsError || !strings.Contains(texts(res), "no such sandbox") {
			t.Errorf("bob's %s on alice's sandbox: %q", tool, texts(res))
		}
	}

	// Bob cannot ride on alice's session either: the SDK binds a session
	// to the key that started it.
	req, _ := http.NewRequest("POST", ts.URL, strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`))
	req.Header.Set("Authorization", "Bearer kb")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", alice.ID())
	req.Header.Set("Mcp-Protocol-Version", alice.InitializeResult().ProtocolVersion)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("bob on alice's session: %d", resp.StatusCode)
	}

	alice.Close() // DELETE ends the session
	testutil.WaitFor(t, 10*time.Second, "alice's sandbox to close with her session", func() bool {
		return len(svc.List("alice")) == 0 && len(testutil.CgroupsUnder(cgroupParent)) == 0
	})
	bob.Close()
}

// A model pauses a sandbox it will not need for a while and goes on with
// it later: resume_sandbox, or any tool given its id, resumes it.
func TestPauseSandboxTool(t *testing.T) {
	if _, err := criu.Usable(); err != nil {
		t.Skipf("pausing needs CRIU, not built here (make criu): %v", err)
	}
	svc := newService(t)
	cs := connect(t, mcp.Config{Service: svc})
	res := call(t, cs, "create_sandbox", map[string]any{})
	id := res.StructuredContent.(map[string]any)["sandbox_id"].(string)
	mustOK(t, call(t, cs, "run_python", map[string]any{"code": "x = 41", "sandbox_id": id}))
	mustOK(t, call(t, cs, "pause_sandbox", map[string]any{"sandbox_id": id}))
	if info, _ := svc.Info("owner", id); info.State != "paused" {
		t.Fatalf("after pause_sandbox: %+v", info)
	}
	mustOK(t, call(t, cs, "pause_sandbox", map[string]any{"sandbox_id": id})) // idempotent
	if out := mustOK(t, call(t, cs, "run_python", map[string]any{"code": "x + 1", "sandbox_id": id})); !strings.Contains(out, "42") {
		t.Fatalf("run_python on the paused sandbox: %q", out)
	}
	mustOK(t, call(t, cs, "pause_sandbox", map[string]any{"sandbox_id": id}))
	mustOK(t, call(t, cs, "resume_sandbox", map[string]any{"sandbox_id": id}))
	if info, _ := svc.Info("owner", id); info.State != "idle" {
		t.Fatalf("after resume_sandbox: %+v", info)
	}
	mustOK(t, call(t, cs, "close_sandbox", map[string]any{"sandbox_id": id}))
}

// fork_sandbox copies a sandbox into new ones of the session's, each with
// its state; snapshot_sandbox saves one, and create_sandbox starts from
// the snapshot.
func TestForkAndSnapshotTools(t *testing.T) {
	if _, err := criu.Usable(); err != nil {
		t.Skipf("forks and snapshots need CRIU, not built here (make criu): %v", err)
	}
	newService(t) // the backend
	svc := service.New(service.Config{Backend: backend, SnapshotDir: t.TempDir(),
		SnapshotKey: bytes.Repeat([]byte{7}, snapshot.KeySize)})
	t.Cleanup(func() { svc.Close() })
	cs := connect(t, mcp.Config{Service: svc})
	res := call(t, cs, "create_sandbox", map[string]any{})
	id := res.StructuredContent.(map[string]any)["sandbox_id"].(string)
	mustOK(t, call(t, cs, "run_python", map[string]any{"code": "x = 41", "sandbox_id": id}))

	res = call(t, cs, "fork_sandbox", map[string]any{"sandbox_id": id, "count": 2})
	mustOK(t, res)
	ids, _ := res.StructuredContent.(map[string]any)["sandbox_ids"].([]any)
	if len(ids) != 2 {
		t.Fatalf("fork_sandbox: %+v", res.StructuredContent)
	}
	mustOK(t, call(t, cs, "run_python", map[string]any{"code": "x = 0", "sandbox_id": ids[0]}))
	if out := mustOK(t, call(t, cs, "run_python", map[string]any{"code": "x + 1", "sandbox_id": ids[1]})); !strings.Contains(out, "42") {
		t.Fatalf("the second copy: %q", out)
	}
	if res := call(t, cs, "fork_sandbox", map[string]any{"sandbox_id": id, "count": 9}); !res.IsError {
		t.Fatal("nine copies")
	}

	res = call(t, cs, "snapshot_sandbox", map[string]any{"sandbox_id": id, "name": "forty-one"})
	mustOK(t, res)
	snap := res.StructuredContent.(map[string]any)["snapshot_id"].(string)
	if name := res.StructuredContent.(map[string]any)["name"]; name != "forty-one" {
		t.Fatalf("the snapshot's name: %v", name)
	}
	if res := call(t, cs, "snapshot_sandbox", map[string]any{"sandbox_id": id, "name": "Not a name"}); !res.IsError {
		t.Fatal("a bad name taken")
	}
	mustOK(t, call(t, cs, "run_python", map[string]any{"code": "x = 7", "sandbox_id": id}))
	var made []any
	for _, ref := range []string{snap, "forty-one"} {
		res = call(t, cs, "create_sandbox", map[string]any{"from_snapshot": ref})
		mustOK(t, res)
		from := res.StructuredContent.(map[string]any)["sandbox_id"].(string)
		if out := mustOK(t, call(t, cs, "run_python", map[string]any{"code": "x", "sandbox_id": from})); !strings.Contains(out, "41") {
			t.Fatalf("a sandbox of the snapshot %s: %q", ref, out)
		}
		made = append(made, from)
	}
	for _, x := range append([]any{id, ids[0], ids[1]}, made...) {
		mustOK(t, call(t, cs, "close_sandbox", map[string]any{"sandbox_id": x}))
	}
}
