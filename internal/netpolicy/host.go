package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Target is a destination as a sandbox named it, normalised: a host
// name, or an address (an IP literal).
type Target struct {
	Name string     // lower case, no final dot; empty for an address
	Addr netip.Addr // valid for an IP literal, unmapped, without zone
}

func (t Target) String() string {
	if t.Addr.IsValid() {
		return t.Addr.String()
	}
	return t.Name
}

// ParseTarget normalises a host as it appears in a request (a name, an
// IPv4 address, an IPv6 address with or without brackets). Names are
// ASCII (IDNs in their xn-- form); a name whose last label is a number is
// an IPv4 address in a form resolvers read differently ("127.1",
// "0x7f.1", "2130706433") and is refused.
func ParseTarget(host string) (Target, error) {
	h := host
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
		a, err := netip.ParseAddr(h)
		if err != nil || !a.Is6() {
			return Target{}, fmt.Errorf("%w: %q is not an IPv6 address", ErrInvalid, truncate(host, 80))
		}
	}
	if a, err := netip.ParseAddr(h); err == nil {
		if a.Zone() != "" {
			return Target{}, fmt.Errorf("%w: addresses with a zone (%%) are not accepted", ErrInvalid)
		}
		return Target{Addr: a.Unmap()}, nil
	}
	if looksNumeric(h) {
		return Target{}, fmt.Errorf("%w: %q looks like an IP address in an unusual form; write it as a.b.c.d", ErrInvalid, truncate(host, 80))
	}
	n, err := normalizeName(h)
	if err != nil {
		return Target{}, fmt.Errorf("%w: host %q: %v", ErrInvalid, truncate(host, 80), err)
	}
	return Target{Name: n}, nil
}

// normalizeName checks a host name's syntax and returns it lower case
// without a final dot.
func normalizeName(s string) (string, error) {
	s = strings.TrimSuffix(strings.ToLower(s), ".")
	if s == "" || len(s) > 253 {
		return "", errors.New("a host name has 1 to 253 characters")
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return "", errors.New("each label of a host name has 1 to 63 characters")
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return "", errors.New("a label of a host name cannot start or end with '-'")
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("character %q is not allowed in a host name (letters, digits, '-', '_'; IDNs in their xn-- form)", c)
			}
		}
	}
	if looksNumeric(s) {
		return "", errors.New("the last label is a number: that is an IP address, not a name")
	}
	return s, nil
}

// looksNumeric reports whether the last label of s is a number (decimal,
// octal or 0x hexadecimal), which C resolvers read as (part of) an IPv4
// address.
func looksNumeric(s string) bool {
	s = strings.TrimSuffix(s, ".")
	last := s[strings.LastIndex(s, ".")+1:]
	if last == "" {
		return false
	}
	l := strings.ToLower(last)
	if strings.HasPrefix(l, "0x") {
		l = l[2:]
		for i := 0; i < len(l); i++ {
			if !(l[i] >= '0' && l[i] <= '9' || l[i] >= 'a' && l[i] <= 'f') {
				return false
			}
		}
		return true
	}
	for i := 0; i < len(l); i++ {
		if l[i] < '0' || l[i] > '9' {
			return false
		}
	}
	return true
}
