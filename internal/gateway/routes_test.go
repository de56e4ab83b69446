package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/cluster"
	"github.com/vivarium-sandbox/vivarium/internal/e2b"
	"github.com/vivarium-sandbox/vivarium/internal/httpapi"
	"github.com/vivarium-sandbox/vivarium/internal/route"
)

// TestEveryRoute: every route the adapters declare (and so serve) goes
// through the gateway where its Forward says: a sandbox's, a snapshot's
// and a volume's to the node their ids name (a), what is new to the node
// the load picks (b), lists to both. A route added to an adapter without
// a Forward the gateway knows fails here (New panics); a Forward added to
// package route without the gateway's handling, too.
func TestEveryRoute(t *testing.T) {
	a, b := node(t, "a"), node(t, "b")
	nodes := &fakeNodes{nodes: map[string]cluster.Node{
		"a": {Name: "a", Addr: a.URL, Sandboxes: 5},
		"b": {Name: "b", Addr: b.URL, Sandboxes: 1},
	}}
	g := httptest.NewServer(New(Config{Nodes: nodes, Token: "cluster-token-0123456789"}))
	defer g.Close()

	wildcard := regexp.MustCompile(`\{[^}]*\}`)
	ids := map[route.Forward]string{
		route.Sandbox:  "sb_a_0123456789abcdef01234567",
		route.Snapshot: "snap_a_0123456789abcdef01234567",
		route.Volume:   "vol_a_0123456789abcdef01234567",
		route.VolumeID: "vol_a_0123456789abcdef01234567",
		// A template id names its node; a name goes to the key's.
		route.Template:           "tpl_a_0123456789abcdef01234567",
		route.TemplateOrSnapshot: "tpl_a_0123456789abcdef01234567",
	}
	keyOn, _ := keyNode(nodes.Nodes(), "the-key")
	routes := append(httpapi.ClusterRoutes(), e2b.ClusterRoutes()...)
	for _, rt := range routes {
		method := rt.Method
		if method == "" {
			method = "POST"
		}
		// The path: the first wildcard the id its Forward reads,
		// the others any segment.
		first := true
		p := wildcard.ReplaceAllStringFunc(rt.Path, func(string) string {
			if first {
				first = false
				if id, ok := ids[rt.Forward]; ok {
					return id
				}
			}
			return "x"
		})
		if strings.HasSuffix(p, "/") {
			p += "x" // a subtree
		}
		query := ""
		list, every := rt.Forward.List()
		switch {
		case every:
			query = "?list=" + list
		case rt.Forward == route.Signed:
			query = "?signature=v1_a"
		}
		req, _ := http.NewRequest(method, g.URL+p+query, nil)
		req.Header.Set("E2b-Sandbox-Id", "sb_a_0123456789abcdef01234567")
		req.Header.Set("X-API-Key", "the-key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got := fmt.Sprintf("%d %s", resp.StatusCode, body)
		// What a fake node answers: its name, the method, the path.
		on := func(n string) string { return "200 " + n + " " + method + " " + p + " " }
		switch {
		case every:
			var joined []string
			if list == "" {
				json.Unmarshal(body, &joined)
			} else {
				var m map[string][]string
				json.Unmarshal(body, &m)
				joined = m[list]
			}
			slices.Sort(joined)
			if resp.StatusCode != 200 || !slices.Equal(joined, []string{"a", "b"}) {
				t.Errorf("%s (%v): %s, want both nodes' lists joined", rt.Pattern(), rt.Forward, got)
			}
		case rt.Forward == route.Local:
			if !strings.HasPrefix(got, "200 ok: 2 nodes") && !strings.Contains(got, `"unsupported"`) {
				t.Errorf("%s (local): %s, want the gateway's own health, or 501", rt.Pattern(), got)
			}
		case rt.Forward == route.Sandbox || rt.Forward == route.SandboxHeader || rt.Forward == route.Snapshot ||
			rt.Forward == route.Volume || rt.Forward == route.VolumeID || rt.Forward == route.Signed ||
			rt.Forward == route.Template || rt.Forward == route.TemplateOrSnapshot:
			if !strings.HasPrefix(got, on("a")) {
				t.Errorf("%s (%v): %s, want %q...", rt.Pattern(), rt.Forward, got, on("a"))
			}
		case rt.Forward == route.Pick || rt.Forward == route.Create || rt.Forward == route.NewVolume:
			if !strings.HasPrefix(got, on("b")) {
				t.Errorf("%s (%v): %s, want %q...", rt.Pattern(), rt.Forward, got, on("b"))
			}
		case rt.Forward == route.Key:
			if !strings.HasPrefix(got, on(keyOn.Name)) {
				t.Errorf("%s (%v): %s, want %q...", rt.Pattern(), rt.Forward, got, on(keyOn.Name))
			}
		default:
			t.Errorf("%s: forward %v: this test does not know where it goes", rt.Pattern(), rt.Forward)
		}
	}
}

// A route whose Forward the gateway does not know, or which names no id
// where its Forward reads one, stops the gateway from starting.
func TestUnknownForward(t *testing.T) {
	g := &Gateway{}
	for _, rt := range []route.Route{
		{Method: "GET", Path: "/v1/new"},
		{Method: "GET", Path: "/v1/sandboxes/current", Forward: route.Sandbox},
	} {
		if _, err := g.handler(rt, &vivariumAPI); err == nil {
			t.Errorf("%s (%v): the gateway would forward it", rt.Pattern(), rt.Forward)
		}
	}
}

// The lists the gateway looks names up in are lists the adapters declare,
// with the same field.
func TestListings(t *testing.T) {
	lists := map[string]string{}
	for _, rt := range append(httpapi.ClusterRoutes(), e2b.ClusterRoutes()...) {
		if list, ok := rt.Forward.List(); ok && rt.Method == "GET" {
			lists[rt.Path] = list
		}
	}
	for _, l := range []listing{vivariumAPI.volumes, vivariumAPI.snapshots, e2bAPI.volumes, e2bAPI.snapshots} {
		if list, ok := lists[l.path]; !ok || list != l.key {
			t.Errorf("the gateway lists %s under %q; the adapters declare %q (declared: %v)", l.path, l.key, list, ok)
		}
	}
}

// A key's node is the same at every ask, the keys spread over the
// nodes, and a node that goes moves only its own keys.
func TestKeyNode(t *testing.T) {
	var nodes []cluster.Node
	for _, n := range []string{"a", "b", "c", "d"} {
		nodes = append(nodes, cluster.Node{Name: n})
	}
	count := map[string]int{}
	before := map[string]string{}
	for i := range 4000 {
		key := fmt.Sprintf("key-%d", i)
		n, ok := keyNode(nodes, key)
		if again, _ := keyNode(slices.Clone(nodes), key); !ok || again.Name != n.Name {
			t.Fatalf("key %s: %s, then %s", key, n.Name, again.Name)
		}
		count[n.Name]++
		before[key] = n.Name
	}
	for _, n := range nodes {
		if c := count[n.Name]; c < 800 || c > 1200 {
			t.Errorf("node %s has %d of 4000 keys", n.Name, c)
		}
	}
	without := slices.DeleteFunc(slices.Clone(nodes), func(n cluster.Node) bool { return n.Name == "c" })
	for key, was := range before {
		if n, _ := keyNode(without, key); was != "c" && n.Name != was {
			t.Fatalf("key %s moved from %s to %s when c went", key, was, n.Name)
		}
	}
	if _, ok := keyNode(nil, "k"); ok {
		t.Error("a node of none")
	}
}
