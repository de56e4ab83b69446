package netpolicy

import "net/netip"

// NonPublic says why an address is not on the public internet, or ""
// when it is. local tells the ranges where an operator's own servers can
// be (loopback, private networks, shared address space), from those no
// server of Vivarium's should fetch from whatever it is told: link-local
// (cloud metadata), other metadata addresses, unspecified, multicast,
// broadcast. Servers that fetch for sandboxes (the package relay) refuse
// what a hostile page or redirect points them to with it.
func NonPublic(a netip.Addr) (why string, local bool) {
	a = a.Unmap()
	if why := alwaysRefused(a); why != "" {
		return why, a.IsLoopback()
	}
	if isNonPublic(a) {
		return "a private address", true
	}
	return "", false
}
