// Package netpolicy decides where a sandbox may connect: the server-wide
// allowlist an operator sets, the per-sandbox policy a client asks for
// (always a subset of it), and the addresses refused whatever either
// says (cloud metadata, loopback, link-local, the host itself).
//
// A reader must know four things:
//   - No policy (nil, or None) means no network at all; that is every
//     sandbox's default.
//   - Host names are resolved by the supervisor, never by the sandbox,
//     and only names the policy allows are resolved at all (a lookup of
//     an arbitrary name would carry data out through DNS). Every address
//     a name resolves to is checked, and the caller must dial exactly
//     the checked addresses, never resolve again: a name that rebinds to
//     a refused address is then refused.
//   - A name allowed by a host rule may lead only to public addresses,
//     unless an address range rule lists the private one too: a
//     wildcard such as *.example.com must not become a way into the
//     operator's internal network.
//   - A sandbox's own deny list and its exceptions (Policy.Deny,
//     Policy.Except: E2B's denyOut and allowOut) narrow its rules and
//     never widen them; nothing lifts what is always refused. A policy may
//     be replaced while its sandbox runs: Checker.Recheck then decides an
//     open connection again by the address it was made to.
package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// DefaultPorts are the ports a rule without ports allows: HTTP and HTTPS.
var DefaultPorts = []PortRange{{80, 80}, {443, 443}}

// PortRange is an inclusive range of TCP ports.
type PortRange struct{ Lo, Hi uint16 }

func (r PortRange) String() string {
	if r.Lo == r.Hi {
		return strconv.Itoa(int(r.Lo))
	}
	if r.Lo == 1 && r.Hi == 65535 {
		return "*"
	}
	return fmt.Sprintf("%d-%d", r.Lo, r.Hi)
}

// Rule allows one host pattern or one address range, on some ports.
type Rule struct {
	// Host is an exact name ("api.example.com"), a wildcard that matches
	// every name below a domain ("*.example.com", not example.com
	// itself), or "*" for every name. Empty when Prefix is set.
	Host string
	// Prefix is an address range ("10.0.0.0/8", "2001:db8::/32", a single
	// address as /32 or /128). It allows IP literals (and private
	// addresses a host rule's name resolves to), never names.
	Prefix netip.Prefix
	// Ports is never empty; ParseRule fills in DefaultPorts.
	Ports []PortRange
}

// String is the rule as ParseRule reads it.
func (r Rule) String() string {
	var ports []string
	for _, p := range r.Ports {
		ports = append(ports, p.String())
	}
	target := r.Host
	if r.Prefix.IsValid() {
		target = r.Prefix.String()
		if r.Prefix.Addr().Is6() {
			target = "[" + target + "]"
		}
	}
	return target + ":" + strings.Join(ports, ",")
}

// Limits bound what one sandbox moves through its proxy. Zero means no
// limit (on a Server: the server's own default applies, see Grant).
type Limits struct {
	// MaxBytes is the total of both directions over the sandbox's life.
	MaxBytes int64 `json:"max_bytes,omitempty"`
	// Rate is bytes per second, both directions and every connection
	// together.
	Rate int64 `json:"rate,omitempty"`
	// MaxConns is how many connections may be open at once.
	MaxConns int `json:"max_connections,omitempty"`
}

// Policy is what one sandbox may reach: what Rules allow, less what
// Deny refuses, except what Except lists (see Check).
type Policy struct {
	Rules []Rule
	// Deny refuses what Rules allow: a host rule matches names as the
	// sandbox gives them, an address rule IP literals and every address a
	// name resolves to. A sandbox narrows its own access with it, and may
	// change it while it runs.
	Deny []Rule
	// Except lifts Deny for the destinations it lists (E2B's allowOut
	// beside its denyOut: "allow takes precedence over deny"). It never
	// adds to Rules.
	Except []Rule
	// Packages: the sandbox may reach the server's package index (see
	// package pkgindex), and nothing more by that permission.
	Packages bool
	Limits   Limits
}

// None reports whether p allows nothing: the sandbox has no proxy.
func (p *Policy) None() bool { return p == nil || len(p.Rules) == 0 && !p.Packages }

// Allow lists the rules as ParseRule reads them.
func (p *Policy) Allow() []string {
	if p == nil {
		return nil
	}
	out := make([]string, 0, len(p.Rules))
	for _, r := range p.Rules {
		out = append(out, r.String())
	}
	return out
}

// Bounds on what a rule list may hold.
const (
	MaxRules    = 64
	maxRuleText = 300
)

// ParseRule reads one rule: TARGET[:PORTS], where TARGET is a host name,
// "*.domain", "*", an IPv4 address or range ("10.0.0.0/8"), or an IPv6
// one in brackets ("[2001:db8::/32]", "[2001:db8::1]"), and PORTS is a
// comma-separated list of ports and ranges ("443", "80,443",
// "8000-8100", "*" for all). Without PORTS: 80 and 443.
func ParseRule(s string) (Rule, error) { return parseRule(s, DefaultPorts) }

// ParseRuleAnyPort reads a rule as ParseRule does, but a rule without
// ports means every port: a deny list's "8.8.8.8" refuses 8.8.8.8
// whatever the port.
func ParseRuleAnyPort(s string) (Rule, error) { return parseRule(s, allPorts) }

var allPorts = []PortRange{{1, 65535}}

func parseRule(s string, defaultPorts []PortRange) (Rule, error) {
	s = strings.TrimSpace(s)
	bad := func(why string) (Rule, error) {
		return Rule{}, fmt.Errorf("%w: rule %q: %s", ErrInvalid, truncate(s, 80), why)
	}
	if s == "" || len(s) > maxRuleText {
		return bad("want HOST[:PORTS], *.DOMAIN[:PORTS], CIDR[:PORTS] or [IPV6-CIDR][:PORTS]")
	}
	target, ports := s, ""
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 {
			return bad("unclosed [")
		}
		target, ports = s[1:end], s[end+1:]
		if ports != "" {
			if !strings.HasPrefix(ports, ":") {
				return bad("want ]:PORTS after an IPv6 address")
			}
			ports = ports[1:]
			if ports == "" {
				return bad("no ports after the colon")
			}
		}
	} else if strings.Count(s, ":") > 1 {
		return bad("an IPv6 address or range goes in brackets: [2001:db8::/32]:443")
	} else if i := strings.LastIndex(s, ":"); i >= 0 {
		target, ports = s[:i], s[i+1:]
		if ports == "" {
			return bad("no ports after the colon")
		}
	}
	var r Rule
	if p, err := parsePrefix(target); err == nil {
		r.Prefix = p
	} else if strings.ContainsAny(target, "/") || looksNumeric(target) {
		return bad(err.Error())
	} else if target == "*" {
		r.Host = "*"
	} else {
		name := target
		wild := strings.HasPrefix(name, "*.")
		if wild {
			name = name[2:]
		}
		n, err := normalizeName(name)
		if err != nil {
			return bad(err.Error())
		}
		if wild {
			if !strings.Contains(n, ".") {
				return bad("a wildcard needs a domain of at least two labels (*.example.com), not a top-level domain")
			}
			n = "*." + n
		}
		r.Host = n
	}
	if ports == "" {
		r.Ports = slices.Clone(defaultPorts)
		return r, nil
	}
	pr, err := parsePorts(ports)
	if err != nil {
		return bad(err.Error())
	}
	r.Ports = pr
	return r, nil
}

// ParseRules reads a list of rules.
func ParseRules(list []string) ([]Rule, error) { return parseRules(list, DefaultPorts) }

// ParseRulesAnyPort reads a list of rules with ParseRuleAnyPort.
func ParseRulesAnyPort(list []string) ([]Rule, error) { return parseRules(list, allPorts) }

func parseRules(list []string, defaultPorts []PortRange) ([]Rule, error) {
	if len(list) > MaxRules {
		return nil, fmt.Errorf("%w: at most %d rules, got %d", ErrInvalid, MaxRules, len(list))
	}
	out := make([]Rule, 0, len(list))
	for _, s := range list {
		r, err := parseRule(s, defaultPorts)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("not an address range: %v", err)
		}
		if p.Addr().Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("addresses with a zone are not accepted")
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("not an IP address")
	}
	if a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("addresses with a zone are not accepted")
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func parsePorts(s string) ([]PortRange, error) {
	if s == "*" {
		return []PortRange{{1, 65535}}, nil
	}
	var out []PortRange
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := parsePort(lo)
		if err != nil {
			return nil, err
		}
		b := a
		if isRange {
			if b, err = parsePort(hi); err != nil {
				return nil, err
			}
			if b < a {
				return nil, fmt.Errorf("port range %s: the end is below the start", part)
			}
		}
		out = append(out, PortRange{a, b})
	}
	return mergePorts(out), nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 || s != strconv.Itoa(n) {
		return 0, fmt.Errorf("port %q: want a number from 1 to 65535", truncate(s, 20))
	}
	return uint16(n), nil
}

// mergePorts sorts ranges and joins those that touch or overlap.
func mergePorts(in []PortRange) []PortRange {
	rs := slices.Clone(in)
	slices.SortFunc(rs, func(a, b PortRange) int { return int(a.Lo) - int(b.Lo) })
	var out []PortRange
	for _, r := range rs {
		if n := len(out); n > 0 && int(r.Lo) <= int(out[n-1].Hi)+1 {
			out[n-1].Hi = max(out[n-1].Hi, r.Hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

func portIn(port uint16, ranges []PortRange) bool {
	for _, r := range ranges {
		if port >= r.Lo && port <= r.Hi {
			return true
		}
	}
	return false
}

// portsWithin reports whether every port of want is in one of have.
func portsWithin(want, have []PortRange) bool {
	have = mergePorts(have)
	for _, w := range want {
		ok := false
		for _, h := range have {
			if w.Lo >= h.Lo && w.Hi <= h.Hi {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// matchesName reports whether a host rule matches a normalised name.
func (r Rule) matchesName(name string) bool {
	switch {
	case r.Host == "":
		return false
	case r.Host == "*":
		return true
	case strings.HasPrefix(r.Host, "*."):
		return strings.HasSuffix(name, r.Host[1:])
	}
	return r.Host == name
}

// coversHost reports whether host rule r allows everything host rule w
// allows.
func (r Rule) coversHost(w Rule) bool {
	switch {
	case r.Host == "" || w.Host == "":
		return false
	case r.Host == "*":
		return true
	case w.Host == "*":
		return false
	case strings.HasPrefix(w.Host, "*."):
		// *.a.example.com is within *.example.com, not within a.example.com.
		return strings.HasPrefix(r.Host, "*.") && strings.HasSuffix(w.Host[1:], r.Host[1:])
	}
	return r.matchesName(w.Host)
}

// coversPrefix reports whether address rule r contains all of w's range.
func (r Rule) coversPrefix(w Rule) bool {
	return r.Prefix.IsValid() && w.Prefix.IsValid() && r.Prefix.Bits() <= w.Prefix.Bits() &&
		r.Prefix.Contains(w.Prefix.Addr())
}

// allowsName reports whether a host rule allows name on port.
func (p *Policy) allowsName(name string, port uint16) bool {
	for _, r := range p.Rules {
		if r.matchesName(name) && portIn(port, r.Ports) {
			return true
		}
	}
	return false
}

// allowsAddr reports whether an address rule allows a on port.
func (p *Policy) allowsAddr(a netip.Addr, port uint16) bool {
	for _, r := range p.Rules {
		if r.Prefix.IsValid() && r.Prefix.Contains(a) && portIn(port, r.Ports) {
			return true
		}
	}
	return false
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
