package e2b

import (
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"
)

// Listing: newest first unless order=asc, filters, and pages whose cursor
// holds when sandboxes come and go between pages.
func TestListOrderFiltersAndPages(t *testing.T) {
	ts, svc := newTestServer(t)
	c := client{t, ts.URL}
	auth := map[string]string{"X-API-Key": "key-a"}
	var ids []string // oldest first
	for _, tpl := range []string{"base", "code-interpreter-v1", "base", "base"} {
		ids = append(ids, c.create("key-a", `{"templateID":"`+tpl+`"}`).SandboxID)
	}
	list := func(query string) ([]string, string) {
		t.Helper()
		resp, b := c.do("GET", "/e2b/v2/sandboxes?"+query, nil, auth)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("list %s: %d %s", query, resp.StatusCode, b)
		}
		var out []listedSandbox
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, sb := range out {
			got = append(got, sb.SandboxID)
		}
		return got, resp.Header.Get("X-Next-Token")
	}
	newest := slices.Clone(ids)
	slices.Reverse(newest)
	if got, next := list(""); !slices.Equal(got, newest) || next != "" {
		t.Fatalf("default order: %v (next %q); want newest first %v", got, next, newest)
	}
	if got, _ := list("order=asc"); !slices.Equal(got, ids) {
		t.Fatalf("asc: %v; want %v", got, ids)
	}
	if got, _ := list("template=code-interpreter-v1"); !slices.Equal(got, ids[1:2]) {
		t.Fatalf("template: %v", got)
	}
	info, err := svc.Info("a", ids[2])
	if err != nil {
		t.Fatal(err)
	}
	after := url.QueryEscape(info.CreatedAt.Format(time.RFC3339Nano))
	if got, _ := list("order=asc&startedAfter=" + after); !slices.Equal(got, ids[2:]) {
		t.Fatalf("startedAfter: %v; want %v", got, ids[2:])
	}

	// Pages of two, newest first; the first sandbox of the next page is
	// killed meanwhile, and a new one starts: neither shifts the pages.
	page1, next := list("limit=2")
	if !slices.Equal(page1, newest[:2]) || next == "" {
		t.Fatalf("page 1: %v %q", page1, next)
	}
	if resp, _ := c.do("DELETE", "/e2b/sandboxes/"+newest[2], nil, auth); resp.StatusCode != http.StatusNoContent {
		t.Fatal("kill")
	}
	c.create("key-a", `{}`)
	page2, next2 := list("limit=2&nextToken=" + url.QueryEscape(next))
	if !slices.Equal(page2, newest[3:]) || next2 != "" {
		t.Fatalf("page 2: %v %q; want %v", page2, next2, newest[3:])
	}

	for _, bad := range []string{"order=up", "limit=0", "limit=101", "nextToken=%21%21", "startedAfter=yesterday"} {
		if resp, b := c.do("GET", "/e2b/v2/sandboxes?"+bad, nil, auth); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d %s", bad, resp.StatusCode, b)
		}
	}
}

// A nextToken is the client's: any string parses or is refused, and a
// cursor the server made reads back as itself.
func FuzzCursor(f *testing.F) {
	f.Add(cursor{started: time.Unix(0, 1_700_000_000_123456789), id: "sb_abc"}.String())
	f.Add("")
	f.Add("!!")
	f.Add("LTEuLQ") // "-1.-"
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := parseCursor(tok)
		if err != nil {
			return
		}
		again, err := parseCursor(c.String())
		if err != nil || again.compare(c) != 0 || again.id != c.id {
			t.Fatalf("%q: %+v, then %+v %v", tok, c, again, err)
		}
	})
}
