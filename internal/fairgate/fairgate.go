// Package fairgate shares a few slots of costly work among the clients
// that ask for it without a key (signed file URLs, which anyone may send):
// at most a server's worth at once, one at a time per client address,
// a few waiting per address, and the rest refused at once or after a
// short wait. One client, however many requests it sends, holds at most
// one slot; every other client still gets its turn.
package fairgate

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// Gate shares out slots.
type Gate struct {
	slots    chan struct{}
	perAddr  int
	wait     time.Duration
	mu       sync.Mutex
	addrs    map[string]*turn
	beforeIn func(addr string) // tests
}

// turn is one address's place at the gate.
type turn struct {
	held chan struct{} // held by the address's request that works
	n    int           // its requests working or waiting
}

// New returns a gate of slots slots, at most perAddr requests of one
// address working or waiting, each waiting wait at most.
func New(slots, perAddr int, wait time.Duration) *Gate {
	return &Gate{slots: make(chan struct{}, slots), perAddr: perAddr, wait: wait, addrs: map[string]*turn{}}
}

// Enter waits for addr's turn, then for a slot, for the gate's wait at
// most and while ctx lasts; ok is false when it had neither in that time,
// or addr has its most requests in already. leave gives both back.
func (g *Gate) Enter(ctx context.Context, addr string) (leave func(), ok bool) {
	g.mu.Lock()
	a := g.addrs[addr]
	if a == nil {
		a = &turn{held: make(chan struct{}, 1)}
		g.addrs[addr] = a
	}
	if a.n >= g.perAddr {
		g.mu.Unlock()
		return nil, false
	}
	a.n++
	g.mu.Unlock()
	out := func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if a.n--; a.n == 0 {
			delete(g.addrs, addr)
		}
	}
	timer := time.NewTimer(g.wait)
	defer timer.Stop()
	select {
	case a.held <- struct{}{}:
	case <-timer.C:
		out()
		return nil, false
	case <-ctx.Done():
		out()
		return nil, false
	}
	select {
	case g.slots <- struct{}{}:
	case <-timer.C:
		<-a.held
		out()
		return nil, false
	case <-ctx.Done():
		<-a.held
		out()
		return nil, false
	}
	return func() {
		<-g.slots
		<-a.held
		out()
	}, true
}

// ClientAddr is the address a request is counted by: the peer's or, when
// forwarded is trusted (behind a cluster's gateway), the client the last
// X-Forwarded-For names; an IPv6 client's /64 counts as one address,
// since one host commonly has all of those.
func ClientAddr(r *http.Request, forwarded bool) string {
	addr := r.RemoteAddr
	if forwarded {
		if vs := r.Header.Values("X-Forwarded-For"); len(vs) > 0 {
			last := vs[len(vs)-1]
			addr = strings.TrimSpace(last[strings.LastIndexByte(last, ',')+1:])
		}
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}
