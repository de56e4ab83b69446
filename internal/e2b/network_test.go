package e2b

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// E2B's network settings, as its SDKs send them, and the request the
// sandbox's policy is granted from.
func TestNetworkRequest(t *testing.T) {
	no, yes := false, true
	for _, tc := range []struct {
		internet *bool
		body     string // network, as JSON
		want     string
	}{
		{nil, ``, `{"all":true}`},
		{&yes, ``, `{"all":true}`},
		{&no, ``, `{"all":true,"deny":["0.0.0.0/0","[::/0]"]}`},
		{nil, `{"denyOut":["0.0.0.0/0"],"allowOut":["1.1.1.1","8.8.8.0/24","api.example.com","*.github.com"]}`,
			`{"all":true,"deny":["0.0.0.0/0","[::/0]"],"except":["1.1.1.1","8.8.8.0/24","api.example.com","*.github.com"]}`},
		{nil, `{"denyOut":["8.8.8.8","2001:db8::/32"]}`, `{"all":true,"deny":["8.8.8.8","[2001:db8::/32]"]}`},
		{&no, `{"allowOut":["1.1.1.1"]}`, `{"all":true,"deny":["0.0.0.0/0","[::/0]"],"except":["1.1.1.1"]}`},
		{nil, `{}`, `{"all":true}`},
	} {
		var nw *networkConfig
		if tc.body != "" {
			nw = &networkConfig{}
			if err := json.Unmarshal([]byte(tc.body), nw); err != nil {
				t.Fatal(err)
			}
		}
		got, _ := json.Marshal(networkRequest(tc.internet, nw))
		if string(got) != tc.want {
			t.Errorf("%v %s: %s, want %s", tc.internet, tc.body, got, tc.want)
		}
	}
}

func TestNetworkOf(t *testing.T) {
	for _, tc := range []struct {
		info *service.NetworkInfo
		want string
	}{
		{nil, `false <nil>`},
		{&service.NetworkInfo{Allow: []string{"*:*"}}, `true <nil>`},
		{&service.NetworkInfo{Allow: []string{"*:*"}, Deny: []string{"0.0.0.0/0:*", "[::/0]:*"}}, `false &{[] [0.0.0.0/0]}`},
		{&service.NetworkInfo{Allow: []string{"*:*"}, Deny: []string{"0.0.0.0/0:*", "[::/0]:*"}, Except: []string{"1.1.1.1/32:*", "api.example.com:*"}},
			`true &{[1.1.1.1 api.example.com] [0.0.0.0/0]}`},
		{&service.NetworkInfo{Allow: []string{"*:*"}, Deny: []string{"8.8.8.8/32:*", "[2001:db8::/32]:*", "[::/0]:*", "evil.test:443"}},
			`true &{[] [8.8.8.8 2001:db8::/32 ::/0 evil.test:443]}`},
	} {
		internet, nw := networkOf(tc.info, service.PortOptions{})
		if nw != nil && (nw.MaskRequestHost != "" || nw.HTTPSPorts != nil) {
			t.Errorf("%+v: port options %+v from none", tc.info, nw)
		}
		got := fmt.Sprint(internet, " <nil>")
		if nw != nil {
			got = fmt.Sprintf("%v &{%v %v}", internet, nw.AllowOut, nw.DenyOut)
		}
		if got != tc.want {
			t.Errorf("%+v: %s, want %s", tc.info, got, tc.want)
		}
	}
}

// PUT /sandboxes/{id}/network and create's network settings, on a server
// whose operator allows nothing: asking for nothing is fine, asking for a
// host is a 403, what cannot be honoured a 501, a malformed entry a 400,
// another key's sandbox a 404.
func TestNetworkRoutes(t *testing.T) {
	ts, _ := newTestServer(t)
	c := client{t, ts.URL}
	a := c.create("key-a", `{"allow_internet_access":false}`)
	auth := map[string]string{"X-API-Key": "key-a", "Content-Type": "application/json"}
	other := map[string]string{"X-API-Key": "key-b", "Content-Type": "application/json"}
	path := "/e2b/sandboxes/" + a.SandboxID + "/network"
	for _, tc := range []struct {
		name, method, path, body string
		header                   map[string]string
		status                   int
		want                     string
	}{
		{"update: empty", "PUT", path, `{}`, auth, 204, ``},
		{"update: deny", "PUT", path, `{"denyOut":["8.8.8.8","2001:db8::/32"],"allow_internet_access":false}`, auth, 204, ``},
		{"update: allowOut", "PUT", path, `{"allowOut":["1.1.1.1"]}`, auth, 403, `no network access`},
		{"update: bad entry", "PUT", path, `{"denyOut":["10.0.0.0/33"]}`, auth, 400, `not an address range`},
		{"update: rules", "PUT", path, `{"rules":{"a.example.com":[{}]}}`, auth, 501, `per-host rules`},
		{"update: another key", "PUT", path, `{}`, other, 404, `not found`},
		{"update: no such sandbox", "PUT", "/e2b/sandboxes/sb_nothere/network", `{}`, auth, 404, `not found`},
		{"create: allowOut", "POST", "/e2b/v2/sandboxes", `{"network":{"denyOut":["0.0.0.0/0"],"allowOut":["1.1.1.1"]}}`, auth, 403, `no network access`},
		{"create: httpsPorts", "POST", "/e2b/v2/sandboxes", `{"network":{"httpsPorts":[8443],"maskRequestHost":"app-${PORT}.internal"}}`, auth, 201, `sandboxID`},
		{"create: bad httpsPorts", "POST", "/e2b/v2/sandboxes", `{"network":{"httpsPorts":[0]}}`, auth, 400, `not a TCP port`},
		{"create: bad maskRequestHost", "POST", "/e2b/v2/sandboxes", `{"network":{"maskRequestHost":"a/b"}}`, auth, 400, `want a host name`},
		{"update: httpsPorts", "PUT", path, `{"httpsPorts":[8443]}`, auth, 501, `set when a sandbox is created`},
		{"info", "GET", "/e2b/sandboxes/" + a.SandboxID, ``, auth, 200, `"allowInternetAccess":false`},
	} {
		resp, b := c.do(tc.method, tc.path, strings.NewReader(tc.body), tc.header)
		if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.want) {
			t.Errorf("%s: %d %s; want %d with %q", tc.name, resp.StatusCode, b, tc.status, tc.want)
		}
	}
}
