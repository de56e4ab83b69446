package netpolicy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Resolver looks up a host name's addresses. *net.Resolver is one; tests
// substitute their own to point names anywhere (rebinding included).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// resolveTimeout bounds one lookup.
const resolveTimeout = 5 * time.Second

// maxAddrs bounds how many of a name's addresses are kept (and tried).
const maxAddrs = 16

// Checker decides one sandbox's connections.
type Checker struct {
	Policy *Policy
	// Resolver resolves allowed names; nil: net.DefaultResolver.
	Resolver Resolver
	// Deny and DenyAddrs are refused like metadata addresses (see Server).
	Deny      []netip.Prefix
	DenyAddrs []netip.AddrPort
	// LocalAddrs lists the host's own addresses, always refused; nil: the
	// addresses of the host's interfaces, read again every few seconds.
	LocalAddrs func() []netip.Addr
}

// Check decides a connection to target on port. It returns the addresses
// the caller may dial, in order, and must dial no other: the name is not
// to be resolved again. A refusal is a *Refusal (errors.Is ErrRefused)
// whose text is for the sandbox's user.
func (c *Checker) Check(ctx context.Context, t Target, port uint16) ([]netip.Addr, error) {
	refuse := func(format string, args ...any) ([]netip.Addr, error) {
		return nil, &Refusal{Reason: fmt.Sprintf(format, args...)}
	}
	if c == nil || c.Policy.None() {
		return refuse("this sandbox has no network access")
	}
	if port == 0 {
		return refuse("port 0 is not a destination")
	}
	dest := fmt.Sprintf("%s port %d", t, port)
	if t.Addr.IsValid() {
		if why := c.refusedAddr(t.Addr, port); why != "" {
			return refuse("%s is always refused: %s", dest, why)
		}
		if !c.Policy.allowsAddr(t.Addr, port) {
			return refuse("%s is not in this sandbox's network allowlist", dest)
		}
		if c.Policy.deniesAddr(t.Addr, port) {
			return refuse("%s is in this sandbox's deny list", dest)
		}
		return []netip.Addr{t.Addr}, nil
	}
	if why := refusedName(t.Name); why != "" {
		return refuse("%s is always refused: %s", dest, why)
	}
	// Only allowed names are resolved: a lookup of any other name would
	// carry whatever it spells to the name's DNS server.
	if !c.Policy.allowsName(t.Name, port) {
		return refuse("%s is not in this sandbox's network allowlist", dest)
	}
	exempt := c.Policy.exemptName(t.Name, port)
	if !exempt && c.Policy.deniesName(t.Name, port) {
		return refuse("%s is in this sandbox's deny list", dest)
	}
	r := c.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	lctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	addrs, err := r.LookupNetIP(lctx, "ip", t.Name)
	if err != nil || len(addrs) == 0 {
		return refuse("%s: the name does not resolve", dest)
	}
	var ok []netip.Addr
	var first string
	for _, a := range addrs {
		a = a.Unmap()
		if why := c.nameAddrRefused(a, port, exempt); why != "" {
			if first == "" {
				first = fmt.Sprintf("%s resolves to %s, %s", t.Name, a, why)
			}
			continue
		}
		if len(ok) < maxAddrs {
			ok = append(ok, a)
		}
	}
	if len(ok) == 0 {
		return refuse("%s is refused: %s", dest, first)
	}
	return ok, nil
}

// refusedAddr says why an address is refused whatever the policy says.
func (c *Checker) refusedAddr(a netip.Addr, port uint16) string {
	if why := alwaysRefused(a); why != "" {
		return why
	}
	for _, p := range c.Deny {
		if p.Contains(a) {
			return "the operator refuses that range"
		}
	}
	for _, ap := range c.DenyAddrs {
		if ap.Port() == port && ap.Addr().Unmap() == a {
			return "the server's own API"
		}
	}
	local := c.LocalAddrs
	if local == nil {
		local = hostAddrs
	}
	for _, l := range local() {
		if l == a {
			return "an address of the host itself"
		}
	}
	return ""
}

// The host's own addresses, cached briefly: interfaces change rarely,
// and a connection storm should not be a storm of netlink dumps.
var (
	hostMu      sync.Mutex
	hostList    []netip.Addr
	hostRead    time.Time
	hostAddrTTL = 2 * time.Second
)

func hostAddrs() []netip.Addr {
	hostMu.Lock()
	defer hostMu.Unlock()
	if time.Since(hostRead) < hostAddrTTL && hostList != nil {
		return hostList
	}
	list := []netip.Addr{}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					list = append(list, ip.Unmap())
				}
			}
		}
	}
	hostList, hostRead = list, time.Now()
	return hostList
}

// Recheck decides again a connection already made to addr, on port, for
// target (as the sandbox named it), under the checker's policy now: nil
// if it may go on, else a *Refusal. Nothing is resolved: the address is
// the one Check returned then, and is judged as Check would judge it
// among a name's addresses.
func (c *Checker) Recheck(t Target, port uint16, addr netip.Addr) error {
	if !t.Addr.IsValid() {
		return c.recheckName(t, port, addr)
	}
	_, err := c.Check(context.Background(), t, port) // an IP literal: no lookup
	return err
}

func (c *Checker) recheckName(t Target, port uint16, a netip.Addr) error {
	refuse := func(format string, args ...any) error { return &Refusal{Reason: fmt.Sprintf(format, args...)} }
	dest := fmt.Sprintf("%s port %d", t, port)
	switch {
	case c == nil || c.Policy.None():
		return refuse("this sandbox has no network access")
	case refusedName(t.Name) != "":
		return refuse("%s is always refused: %s", dest, refusedName(t.Name))
	case !c.Policy.allowsName(t.Name, port):
		return refuse("%s is not in this sandbox's network allowlist", dest)
	}
	exempt := c.Policy.exemptName(t.Name, port)
	if !exempt && c.Policy.deniesName(t.Name, port) {
		return refuse("%s is in this sandbox's deny list", dest)
	}
	if why := c.nameAddrRefused(a.Unmap(), port, exempt); why != "" {
		return refuse("%s is refused: it was reached at %s, %s", dest, a.Unmap(), why)
	}
	return nil
}

// nameAddrRefused says why an address an allowed name resolves to is
// refused, or "": always refused, private without an address rule, or
// in the deny list (unless exempt: an exception lists the name).
func (c *Checker) nameAddrRefused(a netip.Addr, port uint16, exempt bool) string {
	why := c.refusedAddr(a, port)
	if why == "" && isNonPublic(a) && !c.Policy.allowsAddr(a, port) {
		why = "a private address that no address rule of this sandbox lists"
	}
	if why == "" && !exempt && c.Policy.deniesAddr(a, port) {
		why = "an address in this sandbox's deny list"
	}
	return why
}
