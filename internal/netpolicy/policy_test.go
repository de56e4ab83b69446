package netpolicy

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestParseRule(t *testing.T) {
	for _, c := range []struct {
		in, want string // want "" means an error
	}{
		{"example.com", "example.com:80,443"},
		{"Example.COM.", "example.com:80,443"},
		{"*.example.com:443", "*.example.com:443"},
		{"*", "*:80,443"},
		{"*:*", "*:*"},
		{"api.example.com:8000-8100,443", "api.example.com:443,8000-8100"},
		{"api.example.com:80,81,82", "api.example.com:80-82"},
		{"10.0.0.0/8:5432", "10.0.0.0/8:5432"},
		{"10.1.2.3", "10.1.2.3/32:80,443"},
		{"10.1.2.3/16", "10.1.0.0/16:80,443"},
		{"[2001:db8::/32]:443", "[2001:db8::/32]:443"},
		{"[2001:db8::1]", "[2001:db8::1/128]:80,443"},
		{"[::ffff:10.0.0.1]:22", "10.0.0.1/32:22"},
		{"my_host.internal.example:8080", "my_host.internal.example:8080"},
		{"", ""},
		{"2001:db8::/32", ""},
		{"example.com:", ""},
		{"example.com:0", ""},
		{"example.com:65536", ""},
		{"example.com:443-80", ""},
		{"example.com:08", ""},
		{"*.com", ""},
		{"a.*.example.com", ""},
		{"exa mple.com", ""},
		{"-bad.example.com", ""},
		{"ex\u00e4mple.com", ""},
		{"127.1", ""},
		{"0x7f.0.0.1", ""},
		{"2130706433", ""},
		{"10.0.0.0/33", ""},
		{"[fe80::1%eth0]", ""},
		{"[2001:db8::1", ""},
		{"[2001:db8::1]443", ""},
		{strings.Repeat("a", 64) + ".com", ""},
	} {
		r, err := ParseRule(c.in)
		switch {
		case c.want == "" && err == nil:
			t.Errorf("ParseRule(%q) = %v, want an error", c.in, r)
		case c.want != "" && err != nil:
			t.Errorf("ParseRule(%q): %v", c.in, err)
		case c.want != "" && r.String() != c.want:
			t.Errorf("ParseRule(%q) = %s, want %s", c.in, r, c.want)
		case err != nil && !errors.Is(err, ErrInvalid):
			t.Errorf("ParseRule(%q): %v, not ErrInvalid", c.in, err)
		}
	}
}

func mustServer(t *testing.T, rules ...string) *Server {
	t.Helper()
	rs, err := ParseRules(rules)
	if err != nil {
		t.Fatal(err)
	}
	return &Server{Rules: rs, Limits: Limits{MaxBytes: 1 << 20, Rate: 1 << 16, MaxConns: 4}}
}

func TestGrant(t *testing.T) {
	s := mustServer(t, "*.example.com", "api.other.org:443,8443", "10.0.0.0/8:5432", "[2001:db8::/32]:*")
	for _, c := range []struct {
		allow []string
		ok    bool
	}{
		{[]string{"a.example.com"}, true},
		{[]string{"a.b.example.com:443"}, true},
		{[]string{"*.example.com"}, true},
		{[]string{"*.a.example.com"}, true},
		{[]string{"example.com"}, false}, // the wildcard does not cover the domain itself
		{[]string{"a.example.com:22"}, false},
		{[]string{"api.other.org:443"}, true},
		{[]string{"api.other.org:443,8443"}, true},
		{[]string{"api.other.org"}, false}, // 80 is not allowed
		{[]string{"*.other.org:443"}, false},
		{[]string{"10.1.0.0/16:5432"}, true},
		{[]string{"10.1.2.3:5432"}, true},
		{[]string{"10.0.0.0/7:5432"}, false},
		{[]string{"11.0.0.1:5432"}, false},
		{[]string{"[2001:db8:1::/48]:22"}, true},
		{[]string{"*"}, false},
		{[]string{"a.example.com", "evil.com"}, false},
	} {
		p, err := s.Grant(Request{Allow: c.allow})
		if c.ok != (err == nil) {
			t.Errorf("Grant(%v) = %v, %v; want ok=%v", c.allow, p, err, c.ok)
		}
		if err != nil && !c.ok && !errors.Is(err, ErrNotAllowed) {
			t.Errorf("Grant(%v): %v, not ErrNotAllowed", c.allow, err)
		}
	}

	// Nothing asked: no network; limits alone are a mistake.
	if p, err := s.Grant(Request{}); p != nil || err != nil {
		t.Errorf("empty request: %v, %v", p, err)
	}
	if _, err := s.Grant(Request{Limits: Limits{MaxBytes: 10}}); err == nil {
		t.Error("limits without rules accepted")
	}
	// Limits: zero takes the server's, more than the server's is refused.
	p, err := s.Grant(Request{Allow: []string{"a.example.com"}, Limits: Limits{MaxBytes: 1000}})
	if err != nil || p.Limits != (Limits{MaxBytes: 1000, Rate: 1 << 16, MaxConns: 4}) {
		t.Errorf("limits: %+v, %v", p, err)
	}
	for _, l := range []Limits{{MaxBytes: 2 << 20}, {Rate: 1 << 20}, {MaxConns: 5}, {MaxBytes: -1}} {
		if _, err := s.Grant(Request{Allow: []string{"a.example.com"}, Limits: l}); err == nil {
			t.Errorf("limits %+v accepted", l)
		}
	}
	// Packages only where the server offers an index.
	if _, err := s.Grant(Request{Packages: true}); err == nil {
		t.Error("packages granted by a server without an index")
	}
	s.Packages = true
	if p, err := s.Grant(Request{Packages: true}); err != nil || !p.Packages || p.None() {
		t.Errorf("packages: %+v, %v", p, err)
	}
	// A server without any policy grants nothing but "none".
	var none *Server
	if _, err := none.Grant(Request{Allow: []string{"a.example.com"}}); !errors.Is(err, ErrNotAllowed) {
		t.Errorf("nil server: %v", err)
	}
	if _, err := (&Server{}).Grant(Request{Allow: []string{"a.example.com"}}); !errors.Is(err, ErrNotAllowed) {
		t.Errorf("server without rules: %v", err)
	}
}

// fakeResolver answers from a table; every other name does not resolve.
type fakeResolver struct {
	names  map[string][]string
	looked []string
}

func (f *fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	f.looked = append(f.looked, host)
	var out []netip.Addr
	for _, s := range f.names[host] {
		out = append(out, netip.MustParseAddr(s))
	}
	if len(out) == 0 {
		return nil, errors.New("no such host")
	}
	return out, nil
}

func TestCheck(t *testing.T) {
	res := &fakeResolver{names: map[string][]string{
		"api.example.com":       {"93.184.215.14"},
		"dual.example.com":      {"2606:2800:21f:cb07:6820:80da:af6b:8b2c", "93.184.215.14"},
		"rebind.example.com":    {"127.0.0.1"},
		"meta.example.com":      {"169.254.169.254"},
		"meta6.example.com":     {"fd00:ec2::254"},
		"mapped.example.com":    {"::ffff:169.254.169.254"},
		"nat64.example.com":     {"64:ff9b::a9fe:a9fe"},
		"sixtofour.example.com": {"2002:7f00:1::1"},
		"mixed.example.com":     {"127.0.0.1", "93.184.215.15"},
		"internal.example.com":  {"10.1.2.3"},
		"corp.example.com":      {"10.9.9.9"},
		"host.example.com":      {"198.18.0.1"},
		"api.example.net":       {"93.184.215.16"},
		"self.example.com":      {"192.0.2.77"},
		"unspec.example.com":    {"0.0.0.0"},
	}}
	rules, err := ParseRules([]string{"*.example.com", "10.9.0.0/16:80", "93.184.215.14:8080", "192.0.2.0/24:80",
		"metadata.google.internal", "localhost", "169.254.169.254"})
	if err != nil {
		t.Fatal(err)
	}
	c := &Checker{Policy: &Policy{Rules: rules}, Resolver: res,
		LocalAddrs: func() []netip.Addr { return []netip.Addr{netip.MustParseAddr("192.0.2.77")} },
		DenyAddrs:  []netip.AddrPort{netip.MustParseAddrPort("10.9.0.1:80")}}
	for _, tc := range []struct {
		host string
		port uint16
		want string // addresses, or the start of the refusal
	}{
		{"api.example.com", 443, "93.184.215.14"},
		{"API.Example.Com.", 80, "93.184.215.14"},
		{"dual.example.com", 443, "2606:2800:21f:cb07:6820:80da:af6b:8b2c 93.184.215.14"},
		{"api.example.com", 22, "refused: api.example.com port 22 is not in this sandbox's network allowlist"},
		{"api.example.net", 443, "refused: api.example.net port 443 is not in"},
		{"rebind.example.com", 443, "refused: rebind.example.com port 443 is refused: rebind.example.com resolves to 127.0.0.1, a loopback address"},
		{"meta.example.com", 80, "refused: meta.example.com port 80 is refused: meta.example.com resolves to 169.254.169.254, a link-local"},
		{"meta6.example.com", 80, "refused: meta6.example.com port 80 is refused: meta6.example.com resolves to fd00:ec2::254, a cloud metadata address"},
		{"mapped.example.com", 80, "refused: mapped.example.com port 80 is refused: mapped.example.com resolves to 169.254.169.254"},
		{"nat64.example.com", 80, "refused: nat64.example.com port 80 is refused: nat64.example.com resolves to 64:ff9b::a9fe:a9fe, a link-local address (cloud metadata lives there) (inside an IPv6 address)"},
		{"sixtofour.example.com", 80, "refused: sixtofour.example.com port 80 is refused: sixtofour.example.com resolves to 2002:7f00:1::1, a loopback address (inside"},
		{"mixed.example.com", 443, "93.184.215.15"},
		{"internal.example.com", 80, "refused: internal.example.com port 80 is refused: internal.example.com resolves to 10.1.2.3, a private address that no address rule"},
		{"corp.example.com", 80, "10.9.9.9"},
		{"corp.example.com", 443, "refused: corp.example.com port 443 is refused"},
		{"host.example.com", 80, "refused: host.example.com port 80 is refused: host.example.com resolves to 198.18.0.1, a private"},
		{"self.example.com", 80, "refused: self.example.com port 80 is refused: self.example.com resolves to 192.0.2.77, an address of the host itself"},
		{"unspec.example.com", 80, "refused: unspec.example.com port 80 is refused: unspec.example.com resolves to 0.0.0.0, an unspecified address"},
		{"nxdomain.example.com", 80, "refused: nxdomain.example.com port 80: the name does not resolve"},
		{"metadata.google.internal", 80, "refused: metadata.google.internal port 80 is always refused: a cloud metadata service"},
		{"localhost", 80, "refused: localhost port 80 is always refused: the host itself"},
		{"x.localhost", 80, "refused: x.localhost port 80 is always refused"},
		{"169.254.169.254", 80, "refused: 169.254.169.254 port 80 is always refused: a link-local"},
		{"[::ffff:169.254.169.254]", 80, "refused: 169.254.169.254 port 80 is always refused"},
		{"127.0.0.1", 80, "refused: 127.0.0.1 port 80 is always refused: a loopback address"},
		{"[::1]", 80, "refused: ::1 port 80 is always refused: a loopback address"},
		{"0.0.0.0", 80, "refused: 0.0.0.0 port 80 is always refused"},
		{"224.0.0.1", 80, "refused: 224.0.0.1 port 80 is always refused: a multicast address"},
		{"255.255.255.255", 80, "refused: 255.255.255.255 port 80 is always refused"},
		{"100.100.100.200", 80, "refused: 100.100.100.200 port 80 is always refused: a cloud metadata address"},
		{"168.63.129.16", 80, "refused: 168.63.129.16 port 80 is always refused"},
		{"fd00:ec2::254", 80, "refused: fd00:ec2::254 port 80 is always refused"},
		{"10.9.1.1", 80, "10.9.1.1"},
		{"10.9.0.1", 80, "refused: 10.9.0.1 port 80 is always refused: the server's own API"},
		{"10.9.1.1", 443, "refused: 10.9.1.1 port 443 is not in"},
		{"93.184.215.14", 8080, "93.184.215.14"},
		{"93.184.215.14", 443, "refused: 93.184.215.14 port 443 is not in"},
		{"192.0.2.77", 80, "refused: 192.0.2.77 port 80 is always refused: an address of the host itself"},
		{"api.example.com", 0, "refused: port 0"},
	} {
		target, err := ParseTarget(tc.host)
		if err != nil {
			t.Errorf("ParseTarget(%q): %v", tc.host, err)
			continue
		}
		addrs, err := c.Check(context.Background(), target, tc.port)
		var got string
		if err != nil {
			if !errors.Is(err, ErrRefused) {
				t.Errorf("%s:%d: %v is not ErrRefused", tc.host, tc.port, err)
			}
			got = "refused: " + err.Error()
		} else {
			var ss []string
			for _, a := range addrs {
				ss = append(ss, a.String())
			}
			got = strings.Join(ss, " ")
		}
		if !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s:%d: got %q, want %q", tc.host, tc.port, got, tc.want)
		}
	}
	// Names the policy does not allow are never looked up.
	for _, name := range res.looked {
		if strings.HasSuffix(name, ".net") || name == "metadata.google.internal" || name == "localhost" {
			t.Errorf("%s was resolved although refused by name", name)
		}
	}
	// No policy: nothing at all.
	var none *Checker
	if _, err := none.Check(context.Background(), Target{Name: "api.example.com"}, 443); !errors.Is(err, ErrRefused) {
		t.Errorf("nil checker: %v", err)
	}
}

func TestParseTarget(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"example.com", "example.com"},
		{"EXAMPLE.com.", "example.com"},
		{"1.2.3.4", "1.2.3.4"},
		{"[2001:db8::1]", "2001:db8::1"},
		{"2001:db8::1", "2001:db8::1"},
		{"::ffff:1.2.3.4", "1.2.3.4"},
		{"[1.2.3.4]", ""},
		{"fe80::1%eth0", ""},
		{"127.1", ""},
		{"0177.0.0.1", ""},
		{"1.2.3.0x4", ""},
		{"a..b", ""},
		{"", ""},
		{"exa mple.com", ""},
		{"a\x00b.com", ""},
	} {
		got, err := ParseTarget(c.in)
		switch {
		case c.want == "" && err == nil:
			t.Errorf("ParseTarget(%q) = %v, want an error", c.in, got)
		case c.want != "" && (err != nil || got.String() != c.want):
			t.Errorf("ParseTarget(%q) = %v, %v; want %s", c.in, got, err, c.want)
		}
	}
}

func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"example.com", "*.example.com:443", "10.0.0.0/8:5432", "[2001:db8::/32]:*", "a:1-2,3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRule(s)
		if err != nil {
			return
		}
		// What a rule prints, it reads back as the same rule.
		again, err := ParseRule(r.String())
		if err != nil || again.String() != r.String() {
			t.Fatalf("%q -> %s -> %v, %v", s, r, again, err)
		}
		if len(r.Ports) == 0 || (r.Host == "") == !r.Prefix.IsValid() {
			t.Fatalf("%q: malformed rule %+v", s, r)
		}
	})
}

func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"example.com", "1.2.3.4", "[::1]", "127.1", "xn--bcher-kva.example"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tg, err := ParseTarget(s)
		if err != nil {
			return
		}
		if tg.Addr.IsValid() == (tg.Name != "") {
			t.Fatalf("%q: %+v", s, tg)
		}
		if tg.Name != "" {
			if looksNumeric(tg.Name) || strings.ContainsAny(tg.Name, " /:[]%\x00") {
				t.Fatalf("%q: name %q accepted", s, tg.Name)
			}
		}
	})
}
