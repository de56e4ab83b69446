package netpolicy

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// check runs c on host:port and returns the addresses, or "refused: "
// and the reason.
func check(t *testing.T, c *Checker, host string, port uint16) string {
	t.Helper()
	target, err := ParseTarget(host)
	if err != nil {
		t.Fatalf("ParseTarget(%q): %v", host, err)
	}
	addrs, err := c.Check(context.Background(), target, port)
	if err != nil {
		if !errors.Is(err, ErrRefused) {
			t.Errorf("%s:%d: %v is not ErrRefused", host, port, err)
		}
		return "refused: " + err.Error()
	}
	var ss []string
	for _, a := range addrs {
		ss = append(ss, a.String())
	}
	return strings.Join(ss, " ")
}

func mustRules(t *testing.T, anyPort bool, list ...string) []Rule {
	t.Helper()
	parse := ParseRules
	if anyPort {
		parse = ParseRulesAnyPort
	}
	rs, err := parse(list)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestDenyAndExcept: a sandbox's deny list narrows its rules, its
// exceptions lift the deny list (E2B's allowOut over its denyOut), and
// neither ever reaches past the rules or the addresses always refused.
func TestDenyAndExcept(t *testing.T) {
	res := &fakeResolver{names: map[string][]string{
		"api.example.com":    {"93.184.215.14"},
		"cdn.example.com":    {"93.184.216.1", "93.184.215.14"},
		"other.example.com":  {"8.8.8.8"},
		"rebind.example.com": {"127.0.0.1"},
		"v6.example.com":     {"2606:4700::1111"},
	}}
	allow := mustRules(t, false, "*.example.com:*", "8.8.8.0/24:*", "1.1.1.1:*", "10.0.0.0/8:*", "[2606:4700::/32]:*",
		"127.0.0.1:*")
	for _, tc := range []struct {
		name         string
		deny, except []string
		host         string
		port         uint16
		want         string
	}{
		// Deny narrows; a destination it does not name is untouched.
		{"deny an IP", []string{"8.8.8.8"}, nil, "8.8.8.8", 443, "refused: 8.8.8.8 port 443 is in this sandbox's deny list"},
		{"deny an IP, its neighbour", []string{"8.8.8.8"}, nil, "8.8.8.9", 443, "8.8.8.9"},
		{"deny an IP, any port", []string{"8.8.8.8"}, nil, "8.8.8.8", 5353, "refused: 8.8.8.8 port 5353 is in this sandbox's deny list"},
		{"deny a port only", []string{"8.8.8.8:53"}, nil, "8.8.8.8", 443, "8.8.8.8"},
		{"deny a name", []string{"api.example.com"}, nil, "api.example.com", 443, "refused: api.example.com port 443 is in this sandbox's deny list"},
		{"deny a name, wildcard", []string{"*.example.com"}, nil, "api.example.com", 443, "refused: api.example.com port 443 is in"},
		{"deny a name's address", []string{"93.184.215.14"}, nil, "api.example.com", 443,
			"refused: api.example.com port 443 is refused: api.example.com resolves to 93.184.215.14, an address in this sandbox's deny list"},
		{"deny one of a name's addresses", []string{"93.184.215.14"}, nil, "cdn.example.com", 443, "93.184.216.1"},
		// All traffic: 0.0.0.0/0 (E2B's ALL_TRAFFIC) denies every IPv4
		// address, names' included; IPv6 needs ::/0.
		{"deny all v4, IP", []string{"0.0.0.0/0"}, nil, "1.1.1.1", 443, "refused: 1.1.1.1 port 443 is in"},
		{"deny all v4, name", []string{"0.0.0.0/0"}, nil, "api.example.com", 443, "refused: api.example.com port 443 is refused"},
		{"deny all v4, v6 stays", []string{"0.0.0.0/0"}, nil, "v6.example.com", 443, "2606:4700::1111"},
		{"deny all", []string{"0.0.0.0/0", "[::/0]"}, nil, "v6.example.com", 443, "refused: v6.example.com port 443 is refused"},
		// Exceptions lift the deny list, by address or by name.
		{"except an IP", []string{"0.0.0.0/0"}, []string{"1.1.1.1"}, "1.1.1.1", 443, "1.1.1.1"},
		{"except an IP, another", []string{"0.0.0.0/0"}, []string{"1.1.1.1"}, "8.8.8.8", 443, "refused: 8.8.8.8 port 443 is in"},
		{"except a name", []string{"0.0.0.0/0"}, []string{"api.example.com"}, "api.example.com", 443, "93.184.215.14"},
		{"except a name, another", []string{"0.0.0.0/0"}, []string{"api.example.com"}, "other.example.com", 443, "refused: other.example.com port 443 is refused"},
		{"except a name within a denied name", []string{"*.example.com"}, []string{"api.example.com"}, "api.example.com", 443, "93.184.215.14"},
		{"except a name's address", []string{"0.0.0.0/0"}, []string{"93.184.215.0/24"}, "cdn.example.com", 443, "93.184.215.14"},
		{"except inside a denied range", []string{"8.8.8.0/24"}, []string{"8.8.8.8"}, "8.8.8.8", 443, "8.8.8.8"},
		{"except inside a denied range, neighbour", []string{"8.8.8.0/24"}, []string{"8.8.8.8"}, "8.8.8.7", 443, "refused: 8.8.8.7 port 443 is in"},
		{"except a port", []string{"0.0.0.0/0"}, []string{"1.1.1.1:443"}, "1.1.1.1", 80, "refused: 1.1.1.1 port 80 is in"},
		// An exception never widens the rules, nor lifts what is always
		// refused.
		{"except beyond the rules", nil, []string{"9.9.9.9"}, "9.9.9.9", 443, "refused: 9.9.9.9 port 443 is not in this sandbox's network allowlist"},
		{"except a name beyond the rules", nil, []string{"api.example.org"}, "api.example.org", 443, "refused: api.example.org port 443 is not in"},
		{"except loopback", []string{"0.0.0.0/0"}, []string{"127.0.0.1"}, "127.0.0.1", 80, "refused: 127.0.0.1 port 80 is always refused"},
		{"except a rebinding name", []string{"0.0.0.0/0"}, []string{"rebind.example.com"}, "rebind.example.com", 80,
			"refused: rebind.example.com port 80 is refused: rebind.example.com resolves to 127.0.0.1, a loopback address"},
		{"except metadata", nil, []string{"169.254.169.254"}, "169.254.169.254", 80, "refused: 169.254.169.254 port 80 is always refused"},
		// CIDR edges: a /32 and a /31 hold what they say and no more; a
		// v4-mapped address is the v4 one.
		{"deny /31, low", []string{"10.0.0.0/31"}, nil, "10.0.0.0", 80, "refused: 10.0.0.0 port 80 is in"},
		{"deny /31, high", []string{"10.0.0.0/31"}, nil, "10.0.0.1", 80, "refused: 10.0.0.1 port 80 is in"},
		{"deny /31, next", []string{"10.0.0.0/31"}, nil, "10.0.0.2", 80, "10.0.0.2"},
		{"deny /32 written unmasked", []string{"10.0.0.5/30"}, nil, "10.0.0.7", 80, "refused: 10.0.0.7 port 80 is in"},
		{"deny /30, past its end", []string{"10.0.0.5/30"}, nil, "10.0.0.8", 80, "10.0.0.8"},
		{"deny mapped", []string{"[::ffff:8.8.8.8]"}, nil, "8.8.8.8", 80, "refused: 8.8.8.8 port 80 is in"},
		{"deny v4, mapped target", []string{"8.8.8.8"}, nil, "[::ffff:8.8.8.8]", 80, "refused: 8.8.8.8 port 80 is in"},
		{"deny v6 /128", []string{"[2606:4700::1111]"}, nil, "[2606:4700::1111]", 80, "refused: 2606:4700::1111 port 80 is in"},
		{"deny v6 /128, neighbour", []string{"[2606:4700::1111]"}, nil, "[2606:4700::1112]", 80, "2606:4700::1112"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Checker{Policy: &Policy{Rules: allow, Deny: mustRules(t, true, tc.deny...), Except: mustRules(t, true, tc.except...)},
				Resolver: res, LocalAddrs: func() []netip.Addr { return nil }}
			if got := check(t, c, tc.host, tc.port); !strings.HasPrefix(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestGrantNarrowing(t *testing.T) {
	s := mustServer(t, "*.example.com", "api.other.org:443", "10.0.0.0/8:*")
	for _, tc := range []struct {
		name string
		req  Request
		want string // the policy's rules | deny | except, or the start of an error
	}{
		{"all", Request{All: true}, "*.example.com:80,443 api.other.org:443 10.0.0.0/8:* |  | "},
		{"all ignores allow", Request{All: true, Allow: []string{"a.example.com"}}, "*.example.com:80,443 api.other.org:443 10.0.0.0/8:* |  | "},
		{"all, deny", Request{All: true, Deny: []string{"0.0.0.0/0", "a.example.com:443"}}, "*.example.com:80,443 api.other.org:443 10.0.0.0/8:* | 0.0.0.0/0:* a.example.com:443 | "},
		{"all, deny, except", Request{All: true, Deny: []string{"0.0.0.0/0"}, Except: []string{"10.1.2.3", "a.example.com"}},
			"*.example.com:80,443 api.other.org:443 10.0.0.0/8:* | 0.0.0.0/0:* | 10.1.2.3/32:* a.example.com:*"},
		{"allow, deny", Request{Allow: []string{"a.example.com"}, Deny: []string{"a.example.com:80"}}, "a.example.com:80,443 | a.example.com:80 | "},
		// Deny alone narrows nothing into something.
		{"deny alone", Request{Deny: []string{"8.8.8.8"}}, " | 8.8.8.8/32:* | "},
		// An exception the server's allowlist does not hold would never
		// be reached: refused, naming it.
		{"except outside", Request{All: true, Deny: []string{"0.0.0.0/0"}, Except: []string{"1.1.1.1"}},
			"network access not allowed: 1.1.1.1/32:* not within the server's allowlist"},
		{"except a name outside", Request{All: true, Except: []string{"evil.test"}}, "network access not allowed: evil.test:* not within"},
		{"except a wider name", Request{All: true, Except: []string{"*.other.org"}}, "*.example.com:80,443 api.other.org:443 10.0.0.0/8:* |  | *.other.org:*"},
		{"except a wider range", Request{All: true, Except: []string{"0.0.0.0/0"}}, "*.example.com:80,443 api.other.org:443 10.0.0.0/8:* |  | 0.0.0.0/0:*"},
		{"bad deny", Request{All: true, Deny: []string{"10.0.0.0/33"}}, "invalid network policy"},
		{"bad except", Request{All: true, Except: []string{"127.1"}}, "invalid network policy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := s.Grant(tc.req)
			var got string
			if err != nil {
				got = err.Error()
			} else {
				got = strings.Join(p.Allow(), " ") + " | " + strings.Join(p.Denied(), " ") + " | " + strings.Join(p.Excepted(), " ")
			}
			if !strings.HasPrefix(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	// A server that allows nothing: all of it is nothing, without an
	// error; anything named is refused.
	for _, srv := range []*Server{nil, {}} {
		if p, err := srv.Grant(Request{All: true, Deny: []string{"0.0.0.0/0"}}); p != nil || err != nil {
			t.Errorf("all of nothing: %v, %v", p, err)
		}
		if _, err := srv.Grant(Request{All: true, Except: []string{"1.1.1.1"}}); !errors.Is(err, ErrNotAllowed) {
			t.Errorf("an exception on a server that allows nothing: %v", err)
		}
	}
}
