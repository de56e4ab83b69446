package gateway

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/cluster"
	"github.com/vivarium-sandbox/vivarium/internal/e2b"
)

// A flood of forged signed URLs from one address, which the nodes are
// slow to answer, holds one of the gateway's lookups: another client's
// URL is still routed to its node while the flood waits.
func TestSignedFloodStallsNoOne(t *testing.T) {
	release := make(chan struct{})
	held := make(chan struct{}, 64)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(e2b.SignedProbeHeader) == "" {
			fmt.Fprint(w, "served")
			return
		}
		if r.URL.Query().Get("signature") == "v1_good" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		held <- struct{}{}
		select { // a forged URL: the node takes its time
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusUnauthorized)
	}))
	defer slow.Close()
	defer close(release)
	nodes := &fakeNodes{nodes: map[string]cluster.Node{"a": {Name: "a", Addr: slow.URL}}}
	g := httptest.NewServer(New(Config{Nodes: nodes, Token: "cluster-token-0123456789"}))
	defer g.Close()

	from := func(ip string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	}
	flood := from("127.0.0.2")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	codes := make(chan int, 16)
	for range 16 {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", g.URL+"/files?path=x&signature=v1_forged", nil)
			resp, err := flood.Do(req)
			if err != nil {
				codes <- 0
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	select {
	case <-held: // the flood holds a lookup, its node answering nothing yet
	case <-time.After(time.Minute):
		t.Fatal("the flood's lookup never reached the node")
	}
	refused := 0
	for refused < 11 { // all but the one looking up and the 4 a client may have waiting
		select {
		case c := <-codes:
			if c != http.StatusTooManyRequests {
				t.Fatalf("a flooding request was answered %d", c)
			}
			refused++
		case <-time.After(time.Minute):
			t.Fatalf("only %d of the flood's requests were refused", refused)
		}
	}

	done := make(chan string, 1)
	go func() {
		resp, err := from("127.0.0.1").Get(g.URL + "/files?path=x&signature=v1_good")
		if err != nil {
			done <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- fmt.Sprint(resp.StatusCode, " ", string(b))
	}()
	select {
	case got := <-done:
		if got != "200 served" {
			t.Fatalf("another client's signed URL: %s", got)
		}
	case <-time.After(time.Minute):
		t.Fatal("another client's signed URL waited on the flood")
	}
}
