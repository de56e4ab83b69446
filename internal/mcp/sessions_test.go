package mcp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vivarium-sandbox/vivarium/internal/mcp"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// initialize starts a session as a client that then goes away would: one
// initialize request, nothing after. It returns the answer's status, body
// and session id.
func initialize(t *testing.T, url, key string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize",`+
		`"params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"gone","version":"1"}}}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header.Get("Mcp-Session-Id")
}

// started reports whether initialize's answer started a session.
func started(status int, body, id string) bool {
	return status == http.StatusOK && id != "" && strings.Contains(body, `"result":{`) && !strings.Contains(body, `"error"`)
}

// wantRefused starts a session over a bound: the answer is an error
// saying which, and the session the SDK made for the request is gone.
func wantRefused(t *testing.T, what, url, key, says string) {
	t.Helper()
	status, body, id := initialize(t, url, key)
	if !strings.Contains(body, `"error":{"code":-32029,"message":"`+says) {
		t.Fatalf("%s: %d %s; want an error saying %q", what, status, body, says)
	}
	if id == "" {
		return
	}
	req, _ := http.NewRequest("POST", url, strings.NewReader(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("%s: the refused session answers %d", what, resp.StatusCode)
	}
}

// The HTTP sessions open at once are bounded per key and in all: one too
// many is refused with 429 and a message saying which bound; another key
// is unaffected by one at its bound; ending a session gives its place back
// at once.
func TestHTTPSessionsAreBounded(t *testing.T) {
	svc := service.New(service.Config{}) // no backend: sessions need no sandbox
	defer svc.Close()
	h := mcp.NewHandler(mcp.Config{Service: svc, MaxSessionsPerOwner: 2, MaxSessions: 3},
		keys{"ka": "alice", "kb": "bob", "kc": "carol"}, "dev")
	ts := httptest.NewServer(h)
	defer ts.Close()
	defer h.Close()

	a1, err := httpSession(t, ts.URL, "ka")
	if err != nil {
		t.Fatal(err)
	}
	a2, err := httpSession(t, ts.URL, "ka")
	if err != nil {
		t.Fatal(err)
	}
	defer a2.Close()
	if cs, err := httpSession(t, ts.URL, "ka"); err == nil || !strings.Contains(err.Error(), "this key has 2 MCP sessions open") {
		if err == nil {
			cs.Close()
		}
		t.Fatalf("the SDK's client starting a third session of a key with a bound of 2: %v", err)
	}
	wantRefused(t, "a third session of alice's", ts.URL, "ka", "this key has 2 MCP sessions open")

	b1, err := httpSession(t, ts.URL, "kb")
	if err != nil {
		t.Fatalf("bob's first session, alice at her bound: %v", err)
	}
	defer b1.Close()
	wantRefused(t, "a fourth session on the server", ts.URL, "kc", "the server has its maximum of 3 MCP sessions open")

	if err := a1.Close(); err != nil { // DELETE
		t.Fatal(err)
	}
	a3, err := httpSession(t, ts.URL, "ka")
	if err != nil {
		t.Fatalf("a session of alice's after she ended one: %v", err)
	}
	defer a3.Close()
	// The sessions kept work as before.
	for _, cs := range []*sdk.ClientSession{a2, a3, b1} {
		if _, err := cs.ListTools(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
	}
}

// A session whose client went away without ending it is closed after its
// idle time, and its place given back.
func TestAbandonedHTTPSessionsAreClosed(t *testing.T) {
	svc := service.New(service.Config{})
	defer svc.Close()
	// Long enough for the second request below to come before it ends.
	const idle = 5 * time.Second
	h := mcp.NewHandler(mcp.Config{Service: svc, MaxSessionsPerOwner: 1, SessionTimeout: idle}, keys{"ka": "alice"}, "dev")
	ts := httptest.NewServer(h)
	defer ts.Close()
	defer h.Close()

	status, body, id := initialize(t, ts.URL, "ka")
	if !started(status, body, id) {
		t.Fatalf("initialize: %d %s", status, body)
	}
	wantRefused(t, "a second session beside an abandoned one", ts.URL, "ka", "this key has 1 MCP sessions open")
	testutil.WaitFor(t, 3*idle, "the abandoned session to be closed and its place given back", func() bool {
		return started(initialize(t, ts.URL, "ka"))
	})
}

// Only an initialize keeps a session, which is what the bound counts: a
// request of the sessionless protocol (2026-07-28) starts none that lasts.
func TestSessionlessRequestsKeepNoSession(t *testing.T) {
	svc := service.New(service.Config{})
	defer svc.Close()
	h := mcp.NewHandler(mcp.Config{Service: svc, MaxSessionsPerOwner: 1}, keys{"ka": "alice"}, "dev")
	ts := httptest.NewServer(h)
	defer ts.Close()
	defer h.Close()
	for range 3 {
		req, _ := http.NewRequest("POST", ts.URL, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{`+
			`"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"x","version":"1"},`+
			`"io.modelcontextprotocol/clientCapabilities":{}}}}`))
		req.Header.Set("Authorization", "Bearer ka")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if id := resp.Header.Get("Mcp-Session-Id"); id != "" {
			t.Fatalf("a sessionless request was given session %s (%d): the bound on sessions counts initializes only", id, resp.StatusCode)
		}
	}
	if status, body, id := initialize(t, ts.URL, "ka"); !started(status, body, id) {
		t.Fatalf("initialize after sessionless requests: %d %s", status, body)
	}
}
