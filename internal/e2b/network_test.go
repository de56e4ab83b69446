package e2b

import (
	"encoding/json"
	"fmt"
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
		internet, nw := networkOf(tc.info)
		got := fmt.Sprint(internet, " ", nw)
		if nw == nil {
			got = fmt.Sprint(internet, " <nil>")
		}
		if got != tc.want {
			t.Errorf("%+v: %s, want %s", tc.info, got, tc.want)
		}
	}
}
