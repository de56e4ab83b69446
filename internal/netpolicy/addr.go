package netpolicy

import (
	"net/netip"
	"strings"
)

// refusedNames are refused whatever a rule says: cloud metadata services
// and the host's own name for itself. Matched exactly and, for the
// localhost family, as a suffix.
var refusedNames = map[string]string{
	"localhost":                    "the host itself",
	"metadata":                     "a cloud metadata service",
	"metadata.google.internal":     "a cloud metadata service",
	"metadata.goog":                "a cloud metadata service",
	"instance-data":                "a cloud metadata service",
	"instance-data.ec2.internal":   "a cloud metadata service",
	"metadata.azure.com":           "a cloud metadata service",
	"metadata.tencentyun.com":      "a cloud metadata service",
	"metadata.platformequinix.com": "a cloud metadata service",
}

// refusedName says why a normalised name is always refused, or "".
func refusedName(name string) string {
	if why, ok := refusedNames[name]; ok {
		return why
	}
	if strings.HasSuffix(name, ".localhost") {
		return "the host itself"
	}
	return ""
}

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// metadataPrefixes are cloud metadata and platform services outside the
// link-local range (which is refused whole).
var metadataPrefixes = mustPrefixes(
	"100.100.100.200/32", // Alibaba Cloud
	"168.63.129.16/32",   // Azure WireServer
	"192.0.0.192/32",     // Oracle Cloud (legacy)
	"fd00:ec2::254/128",  // AWS IMDS over IPv6
	"fd00:ec2::23/128",   // AWS Time Sync, DNS over IPv6
)

// nonPublic are ranges that are not the public internet: private
// networks, shared address space, documentation and benchmarking ranges,
// reserved space. A name may lead there only if an address rule lists
// the address too; an IP literal needs an address rule anyway.
var nonPublic = mustPrefixes(
	"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", // RFC 1918
	"100.64.0.0/10",   // shared address space (carrier-grade NAT)
	"192.0.0.0/24",    // IETF protocol assignments
	"192.0.2.0/24",    // documentation
	"198.18.0.0/15",   // benchmarking
	"198.51.100.0/24", // documentation
	"203.0.113.0/24",  // documentation
	"240.0.0.0/4",     // reserved
	"fc00::/7",        // unique local
	"fec0::/10",       // site-local (deprecated)
	"2001:db8::/32",   // documentation
	"100::/64",        // discard
)

var (
	nat64     = mustPrefixes("64:ff9b::/96", "64:ff9b:1::/48")
	sixToFour = netip.MustParsePrefix("2002::/16")
	teredo    = netip.MustParsePrefix("2001::/32")
	thisNet   = netip.MustParsePrefix("0.0.0.0/8")
	// ::/96 holds the deprecated IPv4-compatible addresses (::a.b.c.d).
	v4Compat = netip.MustParsePrefix("::/96")
)

// embeddedV4 returns the IPv4 address an IPv6 address carries in a
// translation or tunnelling form (NAT64, 6to4, IPv4-compatible), which a
// gateway on the path could turn into a connection to that address.
func embeddedV4(a netip.Addr) (netip.Addr, bool) {
	if !a.Is6() {
		return netip.Addr{}, false
	}
	b := a.As16()
	for _, p := range nat64 {
		if p.Contains(a) {
			return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}), true
		}
	}
	if sixToFour.Contains(a) {
		return netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}), true
	}
	if v4Compat.Contains(a) && a != netip.IPv6Unspecified() && a != netip.IPv6Loopback() {
		return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}), true
	}
	return netip.Addr{}, false
}

// alwaysRefused says why an address is refused whatever the policy
// says, or "". It does not know the host's own addresses: the Checker
// adds those.
func alwaysRefused(a netip.Addr) string {
	a = a.Unmap()
	if v4, ok := embeddedV4(a); ok {
		if why := alwaysRefused(v4); why != "" {
			return why + " (inside an IPv6 address)"
		}
		if isNonPublic(v4) {
			return "a private address (inside an IPv6 address)"
		}
	}
	switch {
	case !a.IsValid():
		return "not an address"
	case a.IsUnspecified() || thisNet.Contains(a):
		return "an unspecified address"
	case a.IsLoopback():
		return "a loopback address"
	case a.Is4() && a.As4()[0] == 169 && a.As4()[1] == 254:
		return "a link-local address (cloud metadata lives there)"
	case a.IsLinkLocalUnicast():
		return "a link-local address"
	case a.IsMulticast() || a.IsLinkLocalMulticast() || a.IsInterfaceLocalMulticast():
		return "a multicast address"
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "the broadcast address"
	case teredo.Contains(a):
		return "a Teredo tunnel address"
	}
	for _, p := range metadataPrefixes {
		if p.Contains(a) {
			return "a cloud metadata address"
		}
	}
	return ""
}

func isNonPublic(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range nonPublic {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
