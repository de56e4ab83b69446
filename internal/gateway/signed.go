package gateway

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
	"github.com/vivarium-sandbox/vivarium/internal/cluster"
	"github.com/vivarium-sandbox/vivarium/internal/e2b"
	"github.com/vivarium-sandbox/vivarium/internal/fairgate"
)

// toSigned sends a signed file URL (E2B's uploadUrl and downloadUrl, at
// /files with no sandbox id: the signature names the sandbox to the node
// that holds it, and to no one else) to the node that holds its sandbox,
// found by asking every live node at once. Where none does, a node
// answers the URL as it answers any it cannot verify.
func (g *Gateway) toSigned(w http.ResponseWriter, r *http.Request, a *api) {
	// Anyone may send one, without a key, and each asks every node: a
	// few at a time, one at a time per client, so that a flood of forged
	// URLs costs the nodes no more than the same flood sent to one of
	// them, and delays no other client's.
	leave, ok := g.probes.Enter(r.Context(), fairgate.ClientAddr(r, false))
	if !ok {
		w.Header().Set("Retry-After", "1")
		a.fail(w, apierr.Quota, "too many signed file URLs are being looked up at once "+
			"(from this address, or through this gateway): retry in a moment, one at a time")
		return
	}
	defer leave()
	nodes := g.cfg.Nodes.Nodes()
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	found := make(chan cluster.Node, len(nodes))
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(func() {
			if g.probeSigned(ctx, r, n) {
				found <- n
				cancel()
			}
		})
	}
	wg.Wait()
	close(found)
	if n, ok := <-found; ok {
		g.forward(w, r, a, n)
		return
	}
	g.toPicked(w, r, a)
}

// probeSigned asks n whether it holds the sandbox of r's signed URL.
func (g *Gateway) probeSigned(ctx context.Context, r *http.Request, n cluster.Node) bool {
	u, err := url.Parse(n.Addr)
	if err != nil {
		return false
	}
	u.Path, u.RawQuery = r.URL.Path, r.URL.RawQuery
	req, err := http.NewRequestWithContext(ctx, r.Method, u.String(), nil)
	if err != nil {
		return false
	}
	// A node answers 204 when it holds the sandbox of a signed file URL,
	// and does nothing else.
	req.Header.Set(e2b.SignedProbeHeader, "1")
	req.Header.Set(TokenHeader, g.cfg.Token)
	// The client, as forward names it: a node checks one client's
	// signed URLs one at a time.
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		req.Header.Set("X-Forwarded-For", host)
	}
	resp, err := g.proxy.Transport.RoundTrip(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusNoContent
}
