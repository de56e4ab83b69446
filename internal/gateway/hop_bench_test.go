package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/cluster"
)

// BenchmarkHop is what the gateway's code adds to a request, in one
// process: a small execution's request and answer, to a node that answers
// at once, directly and through the gateway (BenchmarkCluster in
// cmd/vivarium measures it between processes, with real nodes).
//
//	go test ./internal/gateway -run '^$' -bench BenchmarkHop -benchtime 3000x
func BenchmarkHop(b *testing.B) {
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"results":[{"text":"42","is_main_result":true}],"stdout":""}`)
	}))
	defer node.Close()
	nodes := &fakeNodes{nodes: map[string]cluster.Node{"a": {Name: "a", Addr: node.URL}}}
	g := httptest.NewServer(New(Config{Nodes: nodes, Token: "cluster-token-0123456789"}))
	defer g.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	run := func(b *testing.B, base string) {
		for b.Loop() {
			resp, err := client.Post(base+"/v1/sandboxes/sb_a_0123456789abcdef01234567/execute", "application/json",
				strings.NewReader(`{"code":"x"}`))
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
	}
	b.Run("direct", func(b *testing.B) { run(b, node.URL) })
	b.Run("gateway", func(b *testing.B) { run(b, g.URL) })
}
