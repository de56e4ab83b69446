package netpolicy

import "net/netip"

// A sandbox's deny list and its exceptions (Policy.Deny, Policy.Except)
// narrow what its Rules allow; they never widen it. In order, for a
// destination the Rules allow:
//  1. an IP literal is refused when a Deny address rule holds it and no
//     Except address rule does;
//  2. a name listed by an Except host rule is exempt from Deny, name and
//     addresses alike (E2B's allowOut: ["api.example.com"] beside
//     denyOut: ["0.0.0.0/0"] reaches api.example.com);
//  3. any other name is refused when a Deny host rule lists it, and each
//     address it resolves to is dropped when a Deny address rule holds it
//     and no Except address rule does.

// ruleStrings lists rules as ParseRule reads them.
func ruleStrings(rs []Rule) []string {
	out := make([]string, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.String())
	}
	return out
}

// Denied lists the deny rules as ParseRule reads them.
func (p *Policy) Denied() []string {
	if p == nil {
		return nil
	}
	return ruleStrings(p.Deny)
}

// Excepted lists the exceptions to Deny as ParseRule reads them.
func (p *Policy) Excepted() []string {
	if p == nil {
		return nil
	}
	return ruleStrings(p.Except)
}

func namesMatch(rs []Rule, name string, port uint16) bool {
	for _, r := range rs {
		if r.matchesName(name) && portIn(port, r.Ports) {
			return true
		}
	}
	return false
}

func addrsMatch(rs []Rule, a netip.Addr, port uint16) bool {
	for _, r := range rs {
		if r.Prefix.IsValid() && r.Prefix.Contains(a) && portIn(port, r.Ports) {
			return true
		}
	}
	return false
}

// deniesAddr reports whether the deny list refuses address a on port.
func (p *Policy) deniesAddr(a netip.Addr, port uint16) bool {
	return addrsMatch(p.Deny, a, port) && !addrsMatch(p.Except, a, port)
}

// exemptName reports whether an exception lists name on port, which
// lifts the deny list for the name and its addresses.
func (p *Policy) exemptName(name string, port uint16) bool {
	return namesMatch(p.Except, name, port)
}

// deniesName reports whether a deny host rule lists name on port.
func (p *Policy) deniesName(name string, port uint16) bool {
	return namesMatch(p.Deny, name, port)
}

// overlaps reports whether some destination is both r's and s's (ports
// aside): a host rule within the other, or address ranges that meet.
func overlaps(r, s Rule) bool {
	if r.Prefix.IsValid() || s.Prefix.IsValid() {
		return r.Prefix.IsValid() && s.Prefix.IsValid() && r.Prefix.Overlaps(s.Prefix)
	}
	return r.coversHost(s) || s.coversHost(r)
}
