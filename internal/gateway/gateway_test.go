package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/cluster"
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
		case r.Method == http.MethodGet && r.URL.Path == "/v1/sandboxes":
			fmt.Fprintf(w, `{"sandboxes":[{"id":"sb_%s_0123456789abcdef01234567"}]}`, name)
		case r.Method == http.MethodGet && r.URL.Path == "/e2b/v2/sandboxes":
			if r.Header.Get("X-Api-Key") == "bad" {
				w.WriteHeader(401)
				fmt.Fprint(w, `{"code":401,"message":"bad key"}`)
				return
			}
			fmt.Fprintf(w, `[{"sandboxID":"sb_%s_0123456789abcdef01234567"}]`, name)
		default:
			fmt.Fprintf(w, "%s %s %s token=%v host=%s", name, r.Method, r.URL.Path, tok, r.Host)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
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
		req, _ := http.NewRequest(method, g.URL+path, nil)
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
		{"POST", "/e2b/sandbox/files", nil, 404, `"not_found"`},
		{"GET", "/v1/sandboxes/..%2f..%2fetc", nil, 400, `"bad_path"`},
		{"GET", "/v1/sandboxes/" + onA + "/../../v1/volumes", nil, 400, `"bad_path"`},
		{"GET", "/v1/sandboxes/" + onA + "//files", nil, 400, `"bad_path"`},
		// What the gateway does not serve yet says so.
		{"GET", "/v1/volumes", nil, 501, `"unsupported"`},
		{"GET", "/metrics", nil, 501, `"unsupported"`},
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
	_, body = do("GET", "/e2b/v2/sandboxes")
	var e2b []map[string]string
	if err := json.Unmarshal([]byte(body), &e2b); err != nil || len(e2b) != 2 {
		t.Fatalf("e2b list: %s %v", body, err)
	}
	// A client's error is the node's answer, not an empty list.
	if code, body := do("GET", "/e2b/v2/sandboxes", "X-Api-Key", "bad"); code != 401 || !strings.Contains(body, "bad key") {
		t.Fatalf("a bad key's list: %d %s", code, body)
	}
	// A node that stops answering: its sandboxes' requests fail fast and
	// say so; lists go on without it and name it.
	a.Close()
	start := time.Now()
	if code, body := do("GET", "/v1/sandboxes/"+onA); code != 502 || !strings.Contains(body, "node_unreachable") || time.Since(start) > 5*time.Second {
		t.Fatalf("an unreachable node: %d %s after %v", code, body, time.Since(start))
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
