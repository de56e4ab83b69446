package testutil

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// NetHost is a host of the test's own: a network namespace joined to the
// host's by a veth pair, with an HTTP server (python3 -m http.server)
// serving Dir. Its address is not the host's, so a network policy treats
// it as any other machine on a private network.
type NetHost struct {
	Name string     // the namespace
	Addr netip.Addr // the server's address, in the namespace
	Peer netip.Addr // the host's end of the veth pair: one of the host's own addresses
	Port int
	Dir  string // what the server serves
}

// URL is the server's address.
func (h *NetHost) URL() string { return fmt.Sprintf("http://%s:%d", h.Addr, h.Port) }

var netHosts atomic.Int32

// NewNetHost makes a NetHost, removed (server, namespace and veth pair) at
// the end of the test. It needs root and iproute2's ip.
func NewNetHost(t testing.TB) *NetHost {
	t.Helper()
	RequireRoot(t)
	ipPath, err := exec.LookPath("ip")
	if err != nil {
		t.Skip("needs iproute2's ip (apt install iproute2)")
	}
	py := RequirePython(t)
	removeDeadNetHosts(ipPath)
	n := int(netHosts.Add(1))
	pid := os.Getpid()
	base := freeSubnet(t)
	h := &NetHost{
		Name: fmt.Sprintf("vivtest-%d-%d", pid, n),
		Peer: base.Next(),
		Addr: base.Next().Next(),
		Port: 8000,
		Dir:  t.TempDir(),
	}
	hostIf, nsIf := fmt.Sprintf("vvh%d_%d", pid%100000, n), fmt.Sprintf("vvn%d_%d", pid%100000, n)
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(ipPath, args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	ip("netns", "add", h.Name)
	t.Cleanup(func() {
		// The veth pair goes with the namespace.
		if out, err := exec.Command(ipPath, "netns", "del", h.Name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", h.Name, err, out)
		}
	})
	ip("link", "add", hostIf, "type", "veth", "peer", "name", nsIf, "netns", h.Name)
	ip("addr", "add", h.Peer.String()+"/30", "dev", hostIf)
	ip("link", "set", hostIf, "up")
	ip("-n", h.Name, "addr", "add", h.Addr.String()+"/30", "dev", nsIf)
	ip("-n", h.Name, "link", "set", nsIf, "up")
	ip("-n", h.Name, "link", "set", "lo", "up")

	srv := exec.Command(ipPath, "netns", "exec", h.Name, py, "-m", "http.server", fmt.Sprint(h.Port),
		"--bind", h.Addr.String(), "--directory", h.Dir)
	// A test binary killed before its clean-up takes its server along.
	srv.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { srv.Wait(); close(exited) }()
	t.Cleanup(func() {
		srv.Process.Kill()
		<-exited
	})
	os.WriteFile(filepath.Join(h.Dir, "hello.txt"), []byte("hello from "+h.Name), 0o644)
	WaitFor(t, 20*time.Second, "the test host's server", func() bool {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(h.Addr, uint16(h.Port)).String(), time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return h
}

// freeSubnet picks a /30 of 10.213.0.0/16 that no interface of the host
// has an address in (test binaries of other packages make hosts at the
// same time), starting at a random one.
func freeSubnet(t testing.TB) netip.Addr {
	t.Helper()
	start := rand.IntN(1 << 14)
	for i := range 1 << 14 {
		slot := (start + i) % (1 << 14)
		base := netip.AddrFrom4([4]byte{10, 213, byte(slot >> 6), byte(slot&63) << 2})
		p := netip.PrefixFrom(base, 30)
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			t.Fatal(err)
		}
		used := false
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(ipn.IP); ok && p.Contains(ip.Unmap()) {
					used = true
				}
			}
		}
		if !used {
			return base
		}
	}
	t.Fatal("no free /30 in 10.213.0.0/16")
	return netip.Addr{}
}

// removeDeadNetHosts removes the namespaces of NetHosts whose test binary
// was killed before its clean-up (their names carry its pid).
func removeDeadNetHosts(ipPath string) {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		var pid, n int
		if _, err := fmt.Sscanf(e.Name(), "vivtest-%d-%d", &pid, &n); err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
			exec.Command(ipPath, "netns", "del", e.Name()).Run()
		}
	}
}
