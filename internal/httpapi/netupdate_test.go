package httpapi_test

import (
	"strings"
	"testing"
)

// A running sandbox's network changes with PUT /v1/sandboxes/{id}/network:
// at once, within the server's allowlist, replaced rather than merged,
// and only by its owner.
func TestNetworkUpdate(t *testing.T) {
	w := newNetWorld(t, false)
	alice := client{t, w.url, "alice-key"}
	bob := client{t, w.url, "bob-key"}
	sb := alice.json("POST", "/v1/sandboxes", map[string]any{
		"network": map[string]any{"allow": []string{"api.example.com", "example.com"}},
	}, 201)
	id := sb["id"].(string)
	base := "/v1/sandboxes/" + id
	probe := func() string {
		t.Helper()
		res := alice.json("POST", base+"/execute", map[string]any{"code": netProbe + `
attempt("api", lambda: fetch("http://api.example.com/"))
attempt("example", lambda: fetch("http://example.com/"))
`}, 200)
		return res["stdout"].(string)
	}
	both := "api ok plain hello via api.example.com\nexample ok plain hello via example.com\n"
	if got := probe(); got != both {
		t.Fatalf("before: %q", got)
	}

	// Deny example.com's address: the name still resolves, its address
	// is refused; the other host is untouched.
	info := alice.json("PUT", base+"/network", map[string]any{"allow": []string{"api.example.com", "example.com"},
		"deny": []string{"93.184.215.14"}}, 200)
	if n, _ := info["network"].(map[string]any); n == nil || len(n["deny"].([]any)) != 1 {
		t.Errorf("network after deny: %v", info["network"])
	}
	want := "api ok plain hello via api.example.com\n" +
		"example 403 vivarium: example.com port 80 is refused: example.com resolves to 93.184.215.14, an address in this sandbox's deny list\n"
	if got := probe(); got != want {
		t.Errorf("after deny:\n%s\nwant\n%s", got, want)
	}

	// Asking for more than the server allows changes nothing.
	for _, tc := range []struct {
		body map[string]any
		code int
		msg  string
	}{
		{map[string]any{"allow": []string{"evil.test"}}, 403, "evil.test:80,443 not within the server's allowlist"},
		{map[string]any{"all": true, "deny": []string{"0.0.0.0/0"}, "except": []string{"9.9.9.9"}}, 403, "9.9.9.9/32:* not within"},
		{map[string]any{"allow": []string{"example.com"}, "packages": true}, 403, "package installs are given when a sandbox is created"},
		{map[string]any{"allow": []string{"example.com"}, "max_bytes": 5}, 400, "network limits are set when a sandbox is created"},
		{map[string]any{"deny": []string{"10.0.0.0/33"}}, 400, "not an address range"},
		{map[string]any{"allow": "example.com"}, 400, ""},
	} {
		code, body := alice.do("PUT", base+"/network", tc.body)
		if code != tc.code || !strings.Contains(string(body), tc.msg) {
			t.Errorf("%v: %d %s, want %d %q", tc.body, code, body, tc.code, tc.msg)
		}
	}
	// Another key's request is answered as for a sandbox that does not
	// exist, and changes nothing either.
	if code, body := bob.do("PUT", base+"/network", map[string]any{"all": true}); code != 404 {
		t.Errorf("another key's update: %d %s", code, body)
	}
	if got := probe(); got != want {
		t.Errorf("after refused updates:\n%s\nwant\n%s", got, want)
	}

	// Replaced, not merged: an empty body takes everything away, and
	// "all" gives the server's whole allowlist back.
	info = alice.json("PUT", base+"/network", map[string]any{}, 200)
	if info["network"] != nil {
		t.Errorf("network after an empty update: %v", info["network"])
	}
	none := "api 403 vivarium: this sandbox has no network access\nexample 403 vivarium: this sandbox has no network access\n"
	if got := probe(); got != none {
		t.Errorf("after an empty update: %q", got)
	}
	alice.json("PUT", base+"/network", map[string]any{"all": true}, 200)
	if got := probe(); got != both {
		t.Errorf("after all: %q", got)
	}
	// Deny everything but one name, E2B's way.
	alice.json("PUT", base+"/network", map[string]any{"all": true, "deny": []string{"0.0.0.0/0", "[::/0]"},
		"except": []string{"api.example.com"}}, 200)
	want = "api ok plain hello via api.example.com\n" +
		"example 403 vivarium: example.com port 80 is refused: example.com resolves to 93.184.215.14, an address in this sandbox's deny list\n"
	if got := probe(); got != want {
		t.Errorf("after deny all but one:\n%s\nwant\n%s", got, want)
	}

	// A sandbox made without network has no proxy to open later.
	plain := alice.json("POST", "/v1/sandboxes", nil, 201)
	code, body := alice.do("PUT", "/v1/sandboxes/"+plain["id"].(string)+"/network", map[string]any{"allow": []string{"example.com"}})
	if code != 403 || !strings.Contains(string(body), "created without network access") {
		t.Errorf("update of a sandbox made without network: %d %s", code, body)
	}
	alice.json("PUT", "/v1/sandboxes/"+plain["id"].(string)+"/network", map[string]any{"deny": []string{"0.0.0.0/0"}}, 200)

	// Every request that reached the sandbox is in the audit log, granted
	// or refused (another key's never found one).
	var got []string
	for _, r := range w.records("net_policy") {
		if r.KeyID != "alice" {
			t.Errorf("a record of another key: %+v", r)
		}
		got = append(got, r.Status)
	}
	statuses := []string{"changed", "refused", "refused", "refused", "refused", "refused", "changed", "changed", "changed",
		"refused", "changed"}
	if strings.Join(got, " ") != strings.Join(statuses, " ") {
		t.Errorf("net_policy records: %v, want %v", got, statuses)
	}
}
