package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/cluster"
	e2bsrv "github.com/vivarium-sandbox/vivarium/internal/e2b"
	"github.com/vivarium-sandbox/vivarium/internal/sandboxid"
)

// fakeNodes is a fixed set of nodes, some alive.
type fakeNodes struct {
	mu    sync.Mutex
	nodes map[string]cluster.Node
	picks []string
}

func (f *fakeNodes) Nodes() []cluster.Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []cluster.Node
	for _, n := range f.nodes {
		out = append(out, n)
	}
	return out
}

func (f *fakeNodes) Node(name string) (cluster.Node, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.nodes[name]
	return n, ok
}

func (f *fakeNodes) Pick() (cluster.Node, func(), bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	best := ""
	for name, n := range f.nodes {
		if best == "" || n.Sandboxes < f.nodes[best].Sandboxes {
			best = name
		}
	}
	if best == "" {
		return cluster.Node{}, nil, false
	}
	f.picks = append(f.picks, best)
	return f.nodes[best], func() {}, true
}

// node is a fake Vivarium node: it answers with its name, the path and
// whether the token came, and lists one sandbox of its own.
func node(t *testing.T, name string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok := r.Header.Get(TokenHeader) == "cluster-token-0123456789"
		switch {
		case r.Method == http.MethodGet && r.URL.Query().Has("list"):
			// Any list (TestEveryRoute): this node's name, under the
			// field asked for.
			if key := r.URL.Query().Get("list"); key != "" {
				fmt.Fprintf(w, `{%q:[%q]}`, key, name)
			} else {
				fmt.Fprintf(w, `[%q]`, name)
			}
		case r.Method == http.MethodGet && r.URL.Path == "/e2b/sandboxes/metrics":
			fmt.Fprintf(w, `{"sandboxes":{"sb_%s_0123456789abcdef01234567":{"cpuCount":1}}}`, name)
		case r.Method == http.MethodGet && r.URL.Path == "/v1/sandboxes":
			fmt.Fprintf(w, `{"sandboxes":[{"id":"sb_%s_0123456789abcdef01234567"}]}`, name)
		case r.Method == http.MethodGet && r.URL.Path == "/e2b/v2/sandboxes":
			if r.Header.Get("X-Api-Key") == "bad" {
				w.WriteHeader(401)
				fmt.Fprint(w, `{"code":401,"message":"bad key"}`)
				return
			}
			fmt.Fprintf(w, `[{"sandboxID":"sb_%s_0123456789abcdef01234567"}]`, name)
		case r.Method == http.MethodGet && r.URL.Path == "/v1/volumes":
			listCount.Add(1)
			fmt.Fprintf(w, `{"volumes":[%s]}`, volumesOf(name, "id"))
		case r.Method == http.MethodGet && r.URL.Path == "/e2b/volumes":
			fmt.Fprintf(w, `[%s]`, volumesOf(name, "volumeID"))
		case r.URL.Path == "/files" && r.Header.Get(e2bsrv.SignedProbeHeader) != "":
			if !tok || r.URL.Query().Get("signature") != "v1_"+name {
				w.WriteHeader(401)
				return
			}
			w.WriteHeader(204)
		case r.Method == http.MethodGet && r.URL.Path == "/v1/snapshots":
			snapListCount.Add(1)
			fmt.Fprintf(w, `{"snapshots":[%s]}`, snapshotsOf(name, false))
		case r.Method == http.MethodGet && r.URL.Path == "/e2b/snapshots":
			snapListCount.Add(1)
			fmt.Fprintf(w, `[%s]`, snapshotsOf(name, true))
		default:
			body, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "%s %s %s token=%v host=%s body=%s", name, r.Method, r.URL.Path, tok, r.Host, body)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// listCount counts the fake nodes' lists of volumes, snapListCount of
// snapshots.
var listCount, snapListCount atomic.Int64

// snapshotsOf lists node a's snapshots (named "model" and "both") or b's
// ("both"), in Vivarium's shape or E2B's.
func snapshotsOf(node string, e2b bool) string {
	names := map[string][]string{"a": {"model", "both"}, "b": {"both"}}[node]
	var out []string
	for i, n := range names {
		id := fmt.Sprintf("snap_%s_0123456789abcdef0123456%d", node, i)
		if e2b {
			out = append(out, fmt.Sprintf(`{"snapshotID":%q,"names":[%q]}`, id, n))
		} else {
			out = append(out, fmt.Sprintf(`{"id":%q,"name":%q}`, id, n))
		}
	}
	return strings.Join(out, ",")
}

// volumesOf lists node a's volumes ("data", "shared") or b's ("shared").
func volumesOf(node, idField string) string {
	names := map[string][]string{"a": {"data", "shared"}, "b": {"shared"}}[node]
	var out []string
	for i, n := range names {
		out = append(out, fmt.Sprintf(`{%q:"vol_%s_0123456789abcdef0123456%d","name":%q}`, idField, node, i, n))
	}
	return strings.Join(out, ",")
}

func TestRouting(t *testing.T) {
	a, b := node(t, "a"), node(t, "b")
	nodes := &fakeNodes{nodes: map[string]cluster.Node{
		"a": {Name: "a", Addr: a.URL, Sandboxes: 5},
		"b": {Name: "b", Addr: b.URL, Sandboxes: 1},
	}}
	g := httptest.NewServer(New(Config{Nodes: nodes, Token: "cluster-token-0123456789", Domain: "sb.example.com"}))
	defer g.Close()
	do := func(method, path string, header ...string) (int, string) {
		t.Helper()
		var in io.Reader
		if len(header)%2 == 1 {
			in = strings.NewReader(header[len(header)-1])
		}
		req, _ := http.NewRequest(method, g.URL+path, in)
		for i := 0; i+1 < len(header); i += 2 {
			if header[i] == "Host" {
				req.Host = header[i+1]
			} else {
				req.Header.Set(header[i], header[i+1])
			}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	onA, onGone := "sb_a_0123456789abcdef01234567", "sb_c_0123456789abcdef01234567"
	snapA, host := "snap_a_0123456789abcdef01234567", strings.TrimPrefix(g.URL, "http://")
	for _, c := range []struct {
		method, path string
		header       []string
		code         int
		want         string
	}{
		// New sandboxes and one-shots: the node the load picks (b).
		{"POST", "/v1/sandboxes", nil, 200, "b POST /v1/sandboxes token=true"},
		{"POST", "/v1/execute", nil, 200, "b POST /v1/execute token=true"},
		{"POST", "/e2b/sandboxes", nil, 200, "b POST /e2b/sandboxes token=true"},
		// A sandbox's requests: its node, whatever the load.
		{"POST", "/v1/sandboxes/" + onA + "/execute", nil, 200, "a POST /v1/sandboxes/" + onA + "/execute token=true"},
		{"DELETE", "/e2b/sandboxes/" + onA, nil, 200, "a DELETE /e2b/sandboxes/" + onA},
		{"POST", "/e2b/sandbox/process.Process/Start", []string{"E2b-Sandbox-Id", onA}, 200, "a POST /e2b/sandbox/process.Process/Start"},
		{"GET", "/", []string{"Host", "8000-" + onA + ".sb.example.com"}, 200, "a GET / token=true host=8000-" + onA},
		// MCP: a new session where the load says, a session's requests
		// to the node its id names; an unknown session is not found.
		{"POST", "/mcp", nil, 200, "b POST /mcp token=true"},
		{"POST", "/mcp", []string{"Mcp-Session-Id", "a.0123456789abcdef0123456789abcdef"}, 200, "a POST /mcp"},
		{"DELETE", "/mcp", []string{"Mcp-Session-Id", "c.0123456789abcdef0123456789abcdef"}, 404, `"not_found"`},
		{"GET", "/mcp", []string{"Mcp-Session-Id", "forged"}, 404, `"not_found"`},
		// A node that is gone, an id of no node, no id.
		{"GET", "/v1/sandboxes/" + onGone, nil, 410, `"state_lost"`},
		{"GET", "/v1/sandboxes/sb_0123456789abcdef01234567", nil, 404, `"not_found"`},
		{"POST", "/e2b/sandbox/files", nil, 404, `{"code":404,"message":"no sandbox \"\" in this cluster"}`},
		{"GET", "/v1/sandboxes/..%2f..%2fetc", nil, 400, `"bad_path"`},
		{"GET", "/v1/sandboxes/" + onA + "/../../v1/volumes", nil, 400, `"bad_path"`},
		{"GET", "/v1/sandboxes/" + onA + "//files", nil, 400, `"bad_path"`},
		// Snapshots and volumes: the node their ids name; a volume's
		// name, the node that lists it for the key (one only).
		{"GET", "/v1/snapshots/" + snapA + "/export", nil, 200, "a GET /v1/snapshots/" + snapA + "/export token=true"},
		{"DELETE", "/e2b/templates/" + snapA, nil, 200, "a DELETE /e2b/templates/" + snapA},
		{"DELETE", "/e2b/templates/base", nil, 200, "b DELETE /e2b/templates/base"},
		{"GET", "/v1/snapshots/snap_c_0123456789abcdef01234567", nil, 410, `"state_lost"`},
		{"GET", "/v1/snapshots/snap_0123456789abcdef01234567", nil, 404, `"snapshot_not_found"`},
		{"POST", "/v1/snapshots/import", nil, 200, "b POST /v1/snapshots/import"},
		// A snapshot's name: the node that lists it for the key.
		{"GET", "/v1/snapshots/model", nil, 200, "a GET /v1/snapshots/model token=true"},
		{"DELETE", "/v1/snapshots/model", nil, 200, "a DELETE /v1/snapshots/model"},
		{"GET", "/v1/snapshots/both", nil, 409, "several nodes: use an id"},
		{"GET", "/v1/snapshots/nope", nil, 404, `"snapshot_not_found"`},
		{"GET", "/v1/snapshots/Not%20a%20name", nil, 404, `"snapshot_not_found"`},
		{"DELETE", "/e2b/templates/model", nil, 200, "a DELETE /e2b/templates/model"},
		{"DELETE", "/e2b/templates/model:latest", nil, 200, "a DELETE /e2b/templates/model:latest"},
		{"DELETE", "/e2b/templates/both", nil, 409, "several nodes"},
		{"GET", "/v1/volumes/data", nil, 200, "a GET /v1/volumes/data token=true"},
		{"PUT", "/v1/volumes/vol_b_0123456789abcdef01234567/files/x", []string{"up"}, 200, "b PUT /v1/volumes/vol_b_0123456789abcdef01234567/files/x token=true host=" + host + " body=up"},
		{"GET", "/v1/volumes/shared", nil, 409, "several nodes"},
		{"GET", "/v1/volumes/nope", nil, 404, `"volume_not_found"`},
		{"GET", "/e2b/volumes/data", nil, 200, "a GET /e2b/volumes/data"},
		{"GET", "/e2b/volumecontent/vol_a_0123456789abcdef01234567/file", nil, 200, "a GET /e2b/volumecontent/"},
		{"GET", "/e2b/volumecontent/nope/file", nil, 404, `{"code":404,"message":"no volume \"nope\" in this cluster"}`},
		{"POST", "/v1/volumes", []string{`{"name":"data"}`}, 409, `"exists","message":"the key has a volume named \"data\" already (on node a)`},
		{"POST", "/e2b/volumes", []string{`{"name":"shared"}`}, 409, "already (on node a, b)"},
		{"POST", "/v1/volumes", []string{`{"name":"new"}`}, 200, `b POST /v1/volumes token=true host=` + host + ` body={"name":"new"}`},
		// A new sandbox from a snapshot or with volumes: their node,
		// whatever the load, the body as it came.
		{"POST", "/v1/sandboxes", []string{`{"from_snapshot":"` + snapA + `"}`}, 200, `a POST /v1/sandboxes token=true host=` + host + ` body={"from_snapshot":"` + snapA + `"}`},
		{"POST", "/e2b/v2/sandboxes", []string{`{"templateID":"` + snapA + `"}`}, 200, "a POST /e2b/v2/sandboxes"},
		{"POST", "/v1/sandboxes", []string{`{"from_snapshot":"model"}`}, 200, "a POST /v1/sandboxes"},
		{"POST", "/e2b/v2/sandboxes", []string{`{"templateID":"model:latest"}`}, 200, "a POST /e2b/v2/sandboxes"},
		{"POST", "/v1/sandboxes", []string{`{"from_snapshot":"both"}`}, 409, "several nodes"},
		{"POST", "/v1/sandboxes", []string{`{"from_snapshot":"nope"}`}, 200, "b POST /v1/sandboxes"},
		{"POST", "/v1/sandboxes", []string{`{"volumes":[{"name":"data","path":"/home/user/d"}]}`}, 200, "a POST /v1/sandboxes"},
		{"POST", "/e2b/sandboxes", []string{`{"volumeMounts":[{"name":"data","path":"/d"}]}`}, 200, "a POST /e2b/sandboxes"},
		{"POST", "/v1/sandboxes", []string{`{"volumes":[{"name":"vol_b_0123456789abcdef01234567","path":"/d"}]}`}, 200, "b POST /v1/sandboxes"},
		{"POST", "/v1/sandboxes", []string{`{"volumes":[{"name":"shared","path":"/d"}]}`}, 409, "several nodes"},
		{"POST", "/v1/sandboxes", []string{`{"from_snapshot":"snap_b_0123456789abcdef01234567","volumes":[{"name":"data","path":"/d"}]}`}, 400, "on several"},
		{"POST", "/v1/sandboxes", []string{`{"from_snapshot":"snap_c_0123456789abcdef01234567"}`}, 410, `"state_lost"`},
		{"POST", "/v1/sandboxes", []string{`{"volumes":[{"name":"nope","path":"/d"}]}`}, 200, "b POST /v1/sandboxes"},
		{"POST", "/v1/sandboxes", []string{`{"volumes":[` + strings.Repeat(`{"name":"data","path":"/d"},`, 8) + `{"name":"data","path":"/e"}]}`},
			200, "b POST /v1/sandboxes"}, // over sandbox.MaxVolumes: the node says so, with no lookup
		{"POST", "/v1/sandboxes", []string{`{not json`}, 200, "b POST /v1/sandboxes token=true host=" + host + " body={not json"},
		{"POST", "/v1/sandboxes", []string{`{"env":{"X":"` + strings.Repeat("x", maxBody) + `"}}`}, 413, "too_large"},
		// A signed file URL: the node whose sandbox signed it (each
		// node is asked), else one that says it is not valid.
		{"GET", "/files?path=x&signature=v1_a", nil, 200, "a GET /files token=true"},
		{"POST", "/files?path=x&signature=v1_a", []string{"up"}, 200, "a POST /files token=true host=" + host + " body=up"},
		{"GET", "/files?path=x&signature=v1_forged", nil, 200, "b GET /files"},
		// E2B's API: its errors in E2B's shape, which its SDKs raise by
		// status; a creation's body past the bound is 413 there too.
		{"DELETE", "/e2b/sandboxes/" + onGone, nil, 410, `{"code":410,"message":"sandbox ` + onGone + ` was on node c, which is gone`},
		{"GET", "/e2b/sandboxes/sb_0123456789abcdef01234567", nil, 404, `{"code":404,"message":"no sandbox`},
		{"POST", "/e2b/v2/sandboxes", []string{`{"envVars":{"X":"` + strings.Repeat("x", maxBody) + `"}}`}, 413, `{"code":413,"message":"the request is over`},
		// The latest metrics of sandboxes on both nodes: each node's.
		{"GET", "/e2b/sandboxes/metrics?sandbox_ids=" + onA, nil, 200,
			`{"sandboxes":{"sb_a_0123456789abcdef01234567":{"cpuCount":1},"sb_b_0123456789abcdef01234567":{"cpuCount":1}}}`},
		// E2B's API routes its path decoded: so does the gateway.
		{"GET", "/e2b/sandboxes%2F" + onA, nil, 200, "a GET /e2b/sandboxes/" + onA},
		// What the gateway does not serve says so; what E2B's API does
		// not, any node says in E2B's terms.
		{"GET", "/metrics", nil, 501, `"unsupported"`},
		{"GET", "/v1/teams", nil, 501, `"unsupported"`},
		{"GET", "/e2b/teams", nil, 200, "b GET /e2b/teams"},
	} {
		code, body := do(c.method, c.path, c.header...)
		if code != c.code || !strings.Contains(body, c.want) {
			t.Errorf("%s %s: %d %q, want %d with %q", c.method, c.path, code, body, c.code, c.want)
		}
	}
	// Lists: every node's, together.
	_, body := do("GET", "/v1/sandboxes")
	var list struct{ Sandboxes []map[string]string }
	if err := json.Unmarshal([]byte(body), &list); err != nil || len(list.Sandboxes) != 2 {
		t.Fatalf("list: %s %v", body, err)
	}
	// Two volumes named: each node's list asked for once.
	listCount.Store(0)
	if code, body := do("POST", "/v1/sandboxes", `{"volumes":[{"name":"data","path":"/d"},{"name":"data","path":"/e"}]}`); code != 200 ||
		!strings.HasPrefix(body, "a POST") || listCount.Load() != 2 {
		t.Fatalf("two volumes: %d %q after %d lists, want a's and 2", code, body, listCount.Load())
	}
	// E2B's default templates are never looked up as snapshots.
	snapListCount.Store(0)
	for _, tpl := range []string{"", "base", "code-interpreter-v1"} {
		if code, body := do("POST", "/e2b/v2/sandboxes", `{"templateID":"`+tpl+`"}`); code != 200 || !strings.HasPrefix(body, "b POST") {
			t.Fatalf("template %q: %d %q", tpl, code, body)
		}
	}
	if n := snapListCount.Load(); n != 0 {
		t.Fatalf("%d snapshot lists for default templates", n)
	}
	for path, key := range map[string]string{"/v1/volumes": "volumes", "/v1/snapshots": "snapshots"} {
		_, body = do("GET", path)
		var m map[string][]any
		if err := json.Unmarshal([]byte(body), &m); err != nil || len(m[key]) != 3 {
			t.Fatalf("%s: %s %v", path, body, err)
		}
	}
	_, body = do("GET", "/e2b/v2/sandboxes")
	var e2b []map[string]string
	if err := json.Unmarshal([]byte(body), &e2b); err != nil || len(e2b) != 2 {
		t.Fatalf("e2b list: %s %v", body, err)
	}
	// A client's error is the node's answer, not an empty list.
	if code, body := do("GET", "/e2b/v2/sandboxes", "X-Api-Key", "bad"); code != 401 || !strings.Contains(body, "bad key") {
		t.Fatalf("a bad key's list: %d %s", code, body)
	}
	// A node that stops answering: its sandboxes' requests fail and say
	// so; lists go on without it and name it.
	a.Close()
	if code, body := do("GET", "/v1/sandboxes/"+onA); code != 502 || !strings.Contains(body, "node_unreachable") {
		t.Fatalf("an unreachable node: %d %s", code, body)
	}
	if code, body := do("GET", "/e2b/sandboxes/"+onA); code != 502 || !strings.HasPrefix(body, `{"code":502,"message":"node a did not answer`) {
		t.Fatalf("an unreachable node, through E2B's API: %d %s", code, body)
	}
	req, _ := http.NewRequest("GET", g.URL+"/v1/sandboxes", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Vivarium-Nodes-Missing") != "a" {
		t.Fatalf("a list without a node: %d, missing %q", resp.StatusCode, resp.Header.Get("Vivarium-Nodes-Missing"))
	}
	// No node alive: creation says so.
	nodes.mu.Lock()
	nodes.nodes = map[string]cluster.Node{}
	nodes.mu.Unlock()
	if code, body := do("POST", "/v1/sandboxes"); code != 503 || !strings.Contains(body, "no_node") {
		t.Fatalf("no node: %d %s", code, body)
	}
	if !sandboxid.Valid(onA) {
		t.Fatal("the test's ids are not ids")
	}
}

// TestStreamBeforeBody: a node that answers a stream before its request's
// body has all come (Connect's server streams do) gets the rest of the
// body, and the client the whole stream, through the gateway.
func TestStreamBeforeBody(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		first := make([]byte, 5)
		if _, err := io.ReadFull(r.Body, first); err != nil {
			t.Errorf("node: %v", err)
			return
		}
		fmt.Fprintf(w, "got %s\n", first)
		w.(http.Flusher).Flush()
		rest, err := io.ReadAll(r.Body)
		fmt.Fprintf(w, "then %s %v\n", rest, err)
	}))
	defer srv.Close()
	nodes := &fakeNodes{nodes: map[string]cluster.Node{"a": {Name: "a", Addr: srv.URL}}}
	g := httptest.NewServer(New(Config{Nodes: nodes, Token: "cluster-token-0123456789"}))
	defer g.Close()

	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", g.URL+"/e2b/sandbox/process.Process/Start", pr)
	req.Header.Set("E2b-Sandbox-Id", "sb_a_0123456789abcdef01234567")
	go pw.Write([]byte("first"))
	client := &http.Client{Timeout: 10 * time.Second} // without full duplex, the stream stalls
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("the stream: %d %s", resp.StatusCode, b)
	}
	// The answer has begun; the body's end comes after.
	line := make([]byte, len("got first\n"))
	if _, err := io.ReadFull(resp.Body, line); err != nil || string(line) != "got first\n" {
		t.Fatalf("the stream's start: %q %v", line, err)
	}
	pw.Write([]byte("second"))
	pw.Close()
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "then second <nil>\n" {
		t.Fatalf("the stream's end: %q %v", rest, err)
	}
}
