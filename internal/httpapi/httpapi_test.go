package httpapi_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/httpapi"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

func TestMain(m *testing.M) {
	if native.IsInit() {
		native.RunInit()
	}
	os.Exit(m.Run())
}

// keys is a fixed-table authenticator: token → owner.
type keys map[string]string

func (k keys) Owner(tok string) (string, error) {
	if o, ok := k[tok]; ok {
		return o, nil
	}
	return "", errors.New("no such key")
}

type client struct {
	t   testing.TB
	url string
	key string
}

func (c client) jsonOf(body []byte) map[string]any {
	c.t.Helper()
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		c.t.Fatalf("%v: %s", err, body)
	}
	return m
}

func (c client) do(method, path string, body any) (int, []byte) {
	c.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		r = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		r = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, c.url+path, r)
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func (c client) json(method, path string, body any, want int) map[string]any {
	c.t.Helper()
	code, out := c.do(method, path, body)
	if code != want {
		c.t.Fatalf("%s %s: %d, want %d: %s", method, path, code, want, out)
	}
	var m map[string]any
	if len(out) > 0 {
		if err := json.Unmarshal(out, &m); err != nil {
			c.t.Fatalf("%s %s: %v: %s", method, path, err, out)
		}
	}
	return m
}

func newServer(t testing.TB) (*httptest.Server, *service.Service) {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	b, err := native.New(native.Config{CgroupParent: "vivarium-httpapi-test", UIDBase: native.DefaultUIDBase + 9<<24, UIDRanges: testutil.UIDRanges})
	if err != nil {
		t.Fatal(err)
	}
	svc := service.New(service.Config{Backend: b, MaxPerOwner: 3})
	srv := httptest.NewServer(httpapi.New(svc, keys{"alice-key": "alice", "bob-key": "bob"}, nil))
	t.Cleanup(func() {
		srv.Close()
		svc.Close()
	})
	return srv, svc
}

func TestStatefulSandboxLifecycle(t *testing.T) {
	srv, svc := newServer(t)
	alice := client{t, srv.URL, "alice-key"}
	bob := client{t, srv.URL, "bob-key"}

	sb := alice.json("POST", "/v1/sandboxes", map[string]any{"timeout_s": 60, "metadata": map[string]string{"agent": "a1"}, "env": map[string]string{"GREETING": "hi"}}, 201)
	id := sb["id"].(string)
	base := "/v1/sandboxes/" + id

	res := alice.json("POST", base+"/execute", map[string]any{"code": "import os\nx = 1\nprint(os.environ['GREETING'])"}, 200)
	if res["status"] != "ok" || res["stdout"] != "hi\n" || res["execution_count"] != float64(1) {
		t.Fatalf("%v", res)
	}
	res = alice.json("POST", base+"/execute", map[string]any{"code": "x + 1"}, 200)
	results := res["results"].([]any)
	if len(results) != 1 || results[0].(map[string]any)["text"] != "2" || res["execution_count"] != float64(2) {
		t.Fatalf("state not kept: %v", res)
	}
	res = alice.json("POST", base+"/execute", map[string]any{"code": "1/0"}, 200)
	if res["status"] != "error" || res["error"].(map[string]any)["name"] != "ZeroDivisionError" {
		t.Fatalf("%v", res)
	}

	// Another key sees nothing of it: 404, not 403.
	bob.json("GET", base, nil, 404)
	bob.json("POST", base+"/execute", map[string]any{"code": "1"}, 404)
	bob.json("DELETE", base, nil, 404)
	if l := bob.json("GET", "/v1/sandboxes", nil, 200)["sandboxes"].([]any); len(l) != 0 {
		t.Fatalf("bob lists %v", l)
	}
	if l := alice.json("GET", "/v1/sandboxes", nil, 200)["sandboxes"].([]any); len(l) != 1 {
		t.Fatalf("alice lists %v", l)
	}
	// No key, a wrong key.
	client{t, srv.URL, ""}.json("GET", "/v1/sandboxes", nil, 401)
	client{t, srv.URL, "wrong"}.json("GET", "/v1/sandboxes", nil, 401)

	info := alice.json("POST", base+"/timeout", map[string]any{"timeout_s": 120}, 200)
	if info["timeout_s"] != float64(120) || info["metadata"].(map[string]any)["agent"] != "a1" {
		t.Fatalf("%v", info)
	}
	alice.json("DELETE", base, nil, 204)
	alice.json("GET", base, nil, 404)
	if svc.Live() != 0 {
		t.Fatalf("%d sandboxes live after delete", svc.Live())
	}
}

func TestFilesAPI(t *testing.T) {
	srv, _ := newServer(t)
	c := client{t, srv.URL, "alice-key"}
	id := c.json("POST", "/v1/sandboxes", map[string]any{"limits": map[string]any{"disk": 8 << 20}}, 201)["id"].(string)
	base := "/v1/sandboxes/" + id

	c.json("PUT", base+"/files/data/in.csv", []byte("a,b\n1,2\n"), 201)
	res := c.json("POST", base+"/execute", map[string]any{"code": `
import os
print(open("data/in.csv").read().count("\n"))
open("out.txt", "w").write("result")
os.symlink("/etc/passwd", "link")
os.mkfifo("fifo")`}, 200)
	if res["stdout"] != "2\n" {
		t.Fatalf("%v", res)
	}
	if code, body := c.do("GET", base+"/files/out.txt", nil); code != 200 || string(body) != "result" {
		t.Fatalf("download: %d %q", code, body)
	}
	list := c.json("GET", base+"/files?path=.", nil, 200)["entries"].([]any)
	names := map[string]string{}
	for _, e := range list {
		m := e.(map[string]any)
		names[m["name"].(string)] = m["type"].(string)
	}
	if names["out.txt"] != "file" || names["link"] != "symlink" || names["data"] != "dir" || names["fifo"] != "other" {
		t.Fatalf("list: %v", names)
	}
	// Links, FIFOs, traversal: refused, never followed, never hanging.
	for _, p := range []string{"link", "fifo", "../../etc/passwd", "data/../../x"} {
		code, body := c.do("GET", base+"/files/"+p, nil)
		if code != 400 && code != 404 {
			t.Errorf("GET %s: %d %s", p, code, body)
		}
		if strings.Contains(string(body), "root:") {
			t.Errorf("GET %s leaked the host's passwd", p)
		}
	}
	c.json("PUT", base+"/files/link", []byte("overwrite"), 201) // replaces the link itself
	if b, _ := os.ReadFile("/etc/passwd"); strings.Contains(string(b), "overwrite") {
		t.Fatal("upload followed a link")
	}
	// Over the disk limit: 413, and nothing half-written.
	code, _ := c.do("PUT", base+"/files/big.bin", bytes.Repeat([]byte("x"), 9<<20))
	if code != 413 {
		t.Fatalf("oversized upload: %d", code)
	}
	if code, _ := c.do("GET", base+"/files/big.bin", nil); code != 404 {
		t.Fatalf("oversized upload left a file: %d", code)
	}
	c.json("DELETE", base+"/files/data", nil, 204)
	c.json("GET", base+"/files/data/in.csv", nil, 404)
}

func TestStreamingAndInterrupt(t *testing.T) {
	srv, _ := newServer(t)
	c := client{t, srv.URL, "alice-key"}
	id := c.json("POST", "/v1/sandboxes", nil, 201)["id"].(string)
	base := srv.URL + "/v1/sandboxes/" + id

	c.json("POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"code": "n = 0"}, 200)
	body, _ := json.Marshal(map[string]any{"code": "print('start', flush=True)\ndisplay(42)\nwhile True: n += 1"})
	req, _ := http.NewRequest("POST", base+"/execute", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer alice-key")
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Fatalf("content type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	var types []string
	var end map[string]any
	interrupted := false
	for sc.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("%v: %s", err, sc.Bytes())
		}
		types = append(types, ev["type"].(string))
		// The event arrived while the code still runs: interrupt it.
		if ev["type"] == "result" && !interrupted {
			interrupted = true
			c.json("POST", "/v1/sandboxes/"+id+"/interrupt", nil, 200)
		}
		if ev["type"] == "end" {
			end = ev
		}
	}
	if strings.Join(types, ",") != "stdout,result,error,end" {
		t.Fatalf("events %v", types)
	}
	summary := end["summary"].(map[string]any)
	if summary["status"] != "error" || summary["error"].(map[string]any)["name"] != "KeyboardInterrupt" || summary["state_lost"] == true {
		t.Fatalf("summary %v", summary)
	}
	// The interrupt may land before the loop's first step: n is kept,
	// whatever it counted.
	res := c.json("POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"code": "isinstance(n, int)"}, 200)
	if res["results"].([]any)[0].(map[string]any)["text"] != "True" {
		t.Fatalf("state lost after interrupt: %v", res)
	}
	// Restart: state gone, files kept.
	c.json("PUT", "/v1/sandboxes/"+id+"/files/keep.txt", []byte("k"), 201)
	c.json("POST", "/v1/sandboxes/"+id+"/restart", nil, 200)
	res = c.json("POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"code": "import os\n('n' in globals(), os.path.exists('keep.txt'))"}, 200)
	if res["results"].([]any)[0].(map[string]any)["text"] != "(False, True)" {
		t.Fatalf("after restart: %v", res)
	}
}

func TestCommandsAndOneShot(t *testing.T) {
	srv, _ := newServer(t)
	c := client{t, srv.URL, "alice-key"}
	id := c.json("POST", "/v1/sandboxes", nil, 201)["id"].(string)
	base := "/v1/sandboxes/" + id
	c.json("POST", base+"/execute", map[string]any{"code": "open('made-by-python.txt', 'w').write('py')"}, 200)
	res := c.json("POST", base+"/commands", map[string]any{"cmd": "cat made-by-python.txt; echo; echo err >&2; exit 4"}, 200)
	if res["stdout"] != "py\n" || res["stderr"] != "err\n" || res["exit_code"] != float64(4) || res["status"] != "error" {
		t.Fatalf("%v", res)
	}
	res = c.json("POST", base+"/commands", map[string]any{"cmd": "sleep 30", "timeout_s": 0.5}, 200)
	if res["status"] != "timeout" {
		t.Fatalf("%v", res)
	}
	res = c.json("POST", "/v1/execute", map[string]any{"code": "print(open('in.txt').read())\n6 * 7", "files": map[string]string{"in.txt": "aGVsbG8="}}, 200)
	if res["stdout"] != "hello\n" || res["results"].([]any)[0].(map[string]any)["text"] != "42" {
		t.Fatalf("one-shot: %v", res)
	}
	// Bad input: clear errors.
	c.json("POST", base+"/execute", []byte("{not json"), 400)
	c.json("POST", base+"/execute", map[string]any{"code": "1", "bogus": true}, 400)
	c.json("POST", "/v1/sandboxes", map[string]any{"limits": map[string]any{"memory": 1 << 50}}, 400)
	c.json("POST", base+"/commands", map[string]any{"cmd": ""}, 400)
}

func TestQuotaAndExpiry(t *testing.T) {
	srv, svc := newServer(t)
	c := client{t, srv.URL, "bob-key"}
	var wg sync.WaitGroup
	codes := make([]int, 5)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], _ = c.do("POST", "/v1/sandboxes", map[string]any{"timeout_s": 1})
		}()
	}
	wg.Wait()
	created := 0
	for _, code := range codes {
		switch code {
		case 201:
			created++
		case 429:
		default:
			t.Fatalf("create: %d", code)
		}
	}
	if created != 3 {
		t.Fatalf("%d created with a quota of 3", created)
	}
	testutil.WaitFor(t, 10*time.Second, "idle sandboxes to expire", func() bool { return svc.Live() == 0 })
}

// Every route of the OpenAPI document is served, and every route served is
// in the document.
func TestOpenAPIMatchesServer(t *testing.T) {
	srv, _ := newServer(t)
	c := client{t, srv.URL, "alice-key"}
	doc := c.json("GET", "/openapi.json", nil, 200)
	if doc["openapi"] != "3.1.0" {
		t.Fatalf("openapi %v", doc["openapi"])
	}
	paths := doc["paths"].(map[string]any)
	n := 0
	param := regexp.MustCompile(`\{[a-z]+\}`)
	for p, item := range paths {
		for method := range item.(map[string]any) {
			n++
			url := param.ReplaceAllString(p, "x")
			code, body := c.do(strings.ToUpper(method), url, nil)
			// The mux answers 404 with a plain-text body and 405 for
			// unknown routes; our handlers answer JSON.
			if code == 405 || (code == 404 && !bytes.HasPrefix(body, []byte("{"))) {
				t.Errorf("%s %s in the document is not served: %d %s", method, p, code, body)
			}
		}
	}
	if n != len(httpapi.Routes) {
		t.Errorf("document has %d operations, server %d", n, len(httpapi.Routes))
	}
	code, body := c.do("GET", "/metrics", nil)
	if code != 200 || !strings.Contains(string(body), "vivarium_sandboxes_live") {
		t.Fatalf("metrics: %d %s", code, body)
	}

	// Real answers conform to the document's schemas: right types, no
	// field the document does not name.
	check := func(method, path, docPath string, status int, body any) {
		t.Helper()
		code, out := c.do(method, path, body)
		op := paths[docPath].(map[string]any)[strings.ToLower(method)].(map[string]any)
		resp, ok := op["responses"].(map[string]any)[fmt.Sprint(code)].(map[string]any)
		if code != status || !ok {
			t.Fatalf("%s %s: %d (want %d, documented: %v): %s", method, path, code, status, ok, out)
		}
		schema := resp["content"].(map[string]any)["application/json"].(map[string]any)["schema"]
		var v any
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatal(err)
		}
		if err := conforms(schema, v, "$"); err != nil {
			t.Errorf("%s %s: %v\n%.300s", method, path, err, out)
		}
	}
	id := c.json("POST", "/v1/sandboxes", nil, 201)["id"].(string)
	sb := "/v1/sandboxes/" + id
	check("GET", "/v1/sandboxes", "/v1/sandboxes", 200, nil)
	check("GET", sb, "/v1/sandboxes/{id}", 200, nil)
	check("POST", sb+"/execute", "/v1/sandboxes/{id}/execute", 200, map[string]any{
		"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nprint('x')\ndisplay({'a': 1})\n1/0"})
	check("POST", sb+"/commands", "/v1/sandboxes/{id}/commands", 200, map[string]any{"cmd": "echo hi"})
	check("PUT", sb+"/files/a.txt", "/v1/sandboxes/{id}/files/{path}", 201, []byte("x"))
	check("GET", sb+"/files", "/v1/sandboxes/{id}/files", 200, nil)
	check("POST", sb+"/timeout", "/v1/sandboxes/{id}/timeout", 200, map[string]any{"timeout_s": 30})
	check("POST", sb+"/restart", "/v1/sandboxes/{id}/restart", 200, nil)
	check("POST", "/v1/execute", "/v1/execute", 200, map[string]any{"code": "2 + 2"})
	check("POST", sb+"/contexts", "/v1/sandboxes/{id}/contexts", 201, map[string]any{"language": "bash"})
	check("GET", sb+"/contexts", "/v1/sandboxes/{id}/contexts", 200, nil)
	check("POST", sb+"/contexts/python/restart", "/v1/sandboxes/{id}/contexts/{ctx}/restart", 200, nil)
	check("POST", sb+"/processes", "/v1/sandboxes/{id}/processes", 201, map[string]any{"cmd": "sleep 30", "tag": "t"})
	check("GET", sb+"/processes", "/v1/sandboxes/{id}/processes", 200, nil)
}

// Code contexts keep their own state; tracked processes run in the
// background, take input, stream output and end by a signal.
func TestContextsAndProcesses(t *testing.T) {
	srv, _ := newServer(t)
	c := client{t, srv.URL, "alice-key"}
	sb := "/v1/sandboxes/" + c.json("POST", "/v1/sandboxes", nil, 201)["id"].(string)

	ctx := c.json("POST", sb+"/contexts", map[string]any{"cwd": "/tmp"}, 201)
	if ctx["language"] != "python" || ctx["cwd"] != "/tmp" {
		t.Fatalf("%v", ctx)
	}
	id := ctx["id"].(string)
	c.json("POST", sb+"/execute", map[string]any{"code": "v = 'ctx'", "context": id}, 200)
	c.json("POST", sb+"/execute", map[string]any{"code": "v = 'default'"}, 200)
	res := c.json("POST", sb+"/execute", map[string]any{"code": "import os; v, os.getcwd()", "context": id}, 200)
	if r := res["results"].([]any); len(r) != 1 || r[0].(map[string]any)["text"] != "('ctx', '/tmp')" {
		t.Fatalf("%v", res)
	}
	bash := c.json("POST", sb+"/execute", map[string]any{"code": "X=1; echo $((X+1))", "context": "bash"}, 200)
	if bash["stdout"] != "2\n" {
		t.Fatalf("bash: %v", bash)
	}
	c.json("DELETE", sb+"/contexts/"+id, nil, 204)
	if code, body := c.do("POST", sb+"/execute", map[string]any{"code": "1", "context": id}); code != 404 || !strings.Contains(string(body), "context_not_found") {
		t.Fatalf("removed context: %d %s", code, body)
	}
	c.json("POST", sb+"/contexts", map[string]any{"language": "cobol"}, 400)

	p := c.json("POST", sb+"/processes", map[string]any{"cmd": "read line; echo got $line; sleep 30", "stdin": true}, 201)
	pid := fmt.Sprint(p["pid"])
	list := c.json("GET", sb+"/processes", nil, 200)["processes"].([]any)
	if len(list) != 1 || fmt.Sprint(list[0].(map[string]any)["pid"]) != pid {
		t.Fatalf("list: %v", list)
	}
	events := make(chan string, 16)
	go func() {
		req, _ := http.NewRequest("GET", srv.URL+sb+"/processes/"+pid+"/output", nil)
		req.Header.Set("Authorization", "Bearer alice-key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			close(events)
			return
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			events <- sc.Text()
		}
		close(events)
	}()
	if first := <-events; !strings.Contains(first, `"type":"start"`) {
		t.Fatalf("first event: %s", first)
	}
	c.json("POST", sb+"/processes/"+pid+"/stdin?close=1", []byte("hello\n"), 200)
	if out := <-events; !strings.Contains(out, `"got hello\n"`) {
		t.Fatalf("output: %s", out)
	}
	c.json("POST", sb+"/processes/"+pid+"/signal", map[string]any{"signal": "SIGKILL"}, 200)
	var last string
	for e := range events {
		last = e
	}
	if !strings.Contains(last, `"type":"end"`) || !strings.Contains(last, `"exit_code":137`) {
		t.Fatalf("end: %s", last)
	}
	testutil.WaitFor(t, 5*time.Second, "the process to leave the list", func() bool {
		return len(c.json("GET", sb+"/processes", nil, 200)["processes"].([]any)) == 0
	})
	c.json("POST", sb+"/processes/"+pid+"/signal", map[string]any{"signal": "SIGKILL"}, 404)
	c.json("POST", sb+"/processes/"+pid+"/signal", map[string]any{"signal": "SIGHUP"}, 400)

	// Another key reaches none of it.
	bob := client{t, srv.URL, "bob-key"}
	bob.json("GET", sb+"/contexts", nil, 404)
	bob.json("GET", sb+"/processes", nil, 404)
	bob.json("POST", sb+"/processes", map[string]any{"cmd": "true"}, 404)
}

// conforms checks v against the subset of JSON Schema the document uses.
func conforms(schema any, v any, at string) error {
	s, _ := schema.(map[string]any)
	if s == nil {
		return nil
	}
	if _, typed := s["type"]; !typed && s["properties"] == nil && s["items"] == nil {
		return nil // any JSON value (json.RawMessage: a chart, a DataFrame's data)
	}
	types := []string{}
	switch t := s["type"].(type) {
	case string:
		types = append(types, t)
	case []any:
		for _, x := range t {
			types = append(types, x.(string))
		}
	}
	if len(types) > 0 {
		got := "null"
		switch x := v.(type) {
		case string:
			got = "string"
		case bool:
			got = "boolean"
		case float64:
			got = "number"
			if x == float64(int64(x)) && slices.Contains(types, "integer") {
				got = "integer"
			}
		case []any:
			got = "array"
		case map[string]any:
			got = "object"
		}
		if !slices.Contains(types, got) {
			return fmt.Errorf("%s: %s, want %v", at, got, types)
		}
	}
	switch x := v.(type) {
	case []any:
		for i, e := range x {
			if err := conforms(s["items"], e, fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
	case map[string]any:
		props, _ := s["properties"].(map[string]any)
		for k, e := range x {
			sub, ok := props[k]
			if !ok {
				sub, ok = s["additionalProperties"]
			}
			if !ok {
				return fmt.Errorf("%s.%s: not in the document", at, k)
			}
			if err := conforms(sub, e, at+"."+k); err != nil {
				return err
			}
		}
	}
	return nil
}

// A sandbox in E2B's layout, and a command as its root.
func TestHomeAndRootCommands(t *testing.T) {
	srv, _ := newServer(t)
	c := client{t, srv.URL, "alice-key"}
	id := c.json("POST", "/v1/sandboxes", map[string]any{"home": "/home/user"}, 201)["id"].(string)
	res := c.json("POST", "/v1/sandboxes/"+id+"/commands", map[string]any{"cmd": "pwd; whoami"}, 200)
	if res["stdout"] != "/home/user\nuser\n" {
		t.Fatalf("as the user: %v", res)
	}
	res = c.json("POST", "/v1/sandboxes/"+id+"/commands", map[string]any{"cmd": "whoami; echo x > /etc/app.conf && cat /etc/app.conf",
		"user": "root"}, 200)
	if res["stdout"] != "root\nx\n" {
		t.Fatalf("as root: %v", res)
	}
	c.json("POST", "/v1/sandboxes/"+id+"/commands", map[string]any{"cmd": "true", "user": "admin"}, 400)
	c.json("POST", "/v1/sandboxes", map[string]any{"home": "/etc"}, 400)
}
