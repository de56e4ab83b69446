//go:build linux

package hostile

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Network: a sandbox has a loopback of its own and no route anywhere.
var networkCases = []hostileCase{
	{
		name: "reach_host_loopback_services",
		code: withProbes(`
import socket
for port in os.environ["PORTS"].split():
    s = socket.socket()
    s.settimeout(3)
    attempt("127.0.0.1:" + port, s.connect, ("127.0.0.1", int(port)))
    s6 = socket.socket(socket.AF_INET6)
    s6.settimeout(3)
    attempt("[::1]:" + port, s6.connect, ("::1", int(port)))
`),
		prepare: func(t *testing.T, h *harness, j *job) {
			// A listener of this case's own, beside the canaries' ports.
			accepted := listenCounting(t, "tcp", "127.0.0.1:0")
			port := fmt.Sprint(accepted.addr.(*net.TCPAddr).Port)
			ports := []string{port}
			for _, p := range h.canaries.Ports {
				ports = append(ports, fmt.Sprint(p))
			}
			j.vars["PORTS"] = strings.Join(ports, " ")
			t.Cleanup(func() {
				if n := accepted.n.Load(); n > 0 {
					t.Errorf("the host listener on port %s accepted %d connection(s)", port, n)
				}
			})
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			var want []string
			for _, p := range strings.Fields(o.vars["PORTS"]) {
				want = append(want, "127.0.0.1:"+p+" ECONNREFUSED", "[::1]:"+p+" ECONNREFUSED")
			}
			wantOK(t, o, lines(want...))
		},
	},
	{
		name: "reach_host_unix_sockets",
		code: withProbes(`
import socket
for name in ("\0" + os.environ["ABSTRACT"], "\0/tmp/.X11-unix/X0", "\0/org/freedesktop/systemd1/notify"):
    s = socket.socket(socket.AF_UNIX)
    attempt("abstract " + name[1:], s.connect, name)
for path in (os.environ["HOST_SOCKET"], "/var/run/docker.sock", "/run/containerd/containerd.sock",
             "/run/systemd/private", "/var/run/dbus/system_bus_socket", "/tmp/.X11-unix/X0"):
    s = socket.socket(socket.AF_UNIX)
    attempt(path, s.connect, path)
`),
		prepare: func(t *testing.T, h *harness, j *job) {
			j.vars["ABSTRACT"] = h.canaries.Abstract
			sock := filepath.Join(t.TempDir(), "host.sock")
			accepted := listenCounting(t, "unix", sock)
			j.vars["HOST_SOCKET"] = sock
			t.Cleanup(func() {
				if n := accepted.n.Load(); n > 0 {
					t.Errorf("the host socket %s accepted %d connection(s)", sock, n)
				}
			})
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			// Abstract sockets belong to a network namespace: the host's
			// are not there to refuse.
			wantOK(t, o, lines("abstract "+h.canaries.Abstract+" ECONNREFUSED", "abstract /tmp/.X11-unix/X0 ECONNREFUSED",
				"abstract /org/freedesktop/systemd1/notify ECONNREFUSED", o.vars["HOST_SOCKET"]+" ENOENT",
				"/var/run/docker.sock ENOENT", "/run/containerd/containerd.sock ENOENT", "/run/systemd/private ENOENT",
				"/var/run/dbus/system_bus_socket ENOENT", "/tmp/.X11-unix/X0 ENOENT"))
		},
	},
	{
		name: "reach_host_addresses",
		code: withProbes(`
import socket
for ip in os.environ["HOST_IPS"].split():
    s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
    s.settimeout(3)
    attempt(ip, s.connect, (ip, 22))
`),
		prepare: func(t *testing.T, h *harness, j *job) {
			var ips []string
			addrs, err := net.InterfaceAddrs()
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range addrs {
				if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
					ips = append(ips, n.IP.String())
				}
			}
			if len(ips) == 0 {
				t.Skip("the host has no address but loopback")
			}
			j.vars["HOST_IPS"] = strings.Join(ips, " ")
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			var want []string
			for _, ip := range strings.Fields(o.vars["HOST_IPS"]) {
				want = append(want, ip+" ENETUNREACH")
			}
			wantOK(t, o, lines(want...))
		},
	},
	{
		name: "cloud_metadata",
		code: withProbes(`
import socket
for ip in ("169.254.169.254", "169.254.170.2", "100.100.100.200", "168.63.129.16", "fd00:ec2::254"):
    s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
    s.settimeout(3)
    attempt(ip, s.connect, (ip, 80))
import urllib.request
attempt("urllib", lambda: urllib.request.urlopen("http://169.254.169.254/latest/meta-data/", timeout=3))
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("169.254.169.254 ENETUNREACH", "169.254.170.2 ENETUNREACH",
				"100.100.100.200 ENETUNREACH", "168.63.129.16 ENETUNREACH", "fd00:ec2::254 ENETUNREACH",
				"urllib URLError"))
		},
	},
	{
		name: "reach_internet",
		code: withProbes(`
import socket
for ip, port in (("1.1.1.1", 443), ("8.8.8.8", 53), ("2606:4700:4700::1111", 443)):
    s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
    s.settimeout(3)
    attempt("tcp %s" % ip, s.connect, (ip, port))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
attempt("udp 8.8.8.8", u.sendto, b"x", ("8.8.8.8", 53))
attempt("broadcast", lambda: (u.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1), u.sendto(b"x", ("255.255.255.255", 67))))
print("routes", [l.split()[1] for l in open("/proc/net/route").readlines()[1:]])
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("tcp 1.1.1.1 ENETUNREACH", "tcp 8.8.8.8 ENETUNREACH",
				"tcp 2606:4700:4700::1111 ENETUNREACH", "udp 8.8.8.8 ENETUNREACH", "broadcast ENETUNREACH",
				"routes []"))
		},
	},
	{
		name: "dns",
		code: withProbes(`
import socket
for name in ("example.com", "metadata.google.internal", "kubernetes.default.svc", "host.docker.internal"):
    attempt(name, socket.getaddrinfo, name, 80)
print("localhost", socket.gethostbyname("localhost"))
print("resolv.conf", repr(open("/etc/resolv.conf").read()))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
attempt("query 8.8.8.8 directly", u.sendto, b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01", ("8.8.8.8", 53))
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("example.com gaierror", "metadata.google.internal gaierror",
				"kubernetes.default.svc gaierror", "host.docker.internal gaierror", "localhost 127.0.0.1",
				"resolv.conf ''", "query 8.8.8.8 directly ENETUNREACH"))
		},
	},
	{
		name: "raw_and_packet_sockets",
		code: withProbes(`
import socket
for label, fam, typ, proto in (("raw icmp", socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
                               ("raw tcp", socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP),
                               ("raw ipv6", socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6),
                               ("packet", 17, socket.SOCK_RAW, 0x0300),
                               ("vsock", 40, socket.SOCK_STREAM, 0),
                               ("bluetooth", 31, socket.SOCK_RAW, 0),
                               ("alg", 38, socket.SOCK_SEQPACKET, 0),
                               ("pf_key", 15, socket.SOCK_RAW, 2),
                               ("can", 29, socket.SOCK_RAW, 1),
                               ("ping", socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)):
    attempt(label, lambda: socket.socket(fam, typ, proto).close())
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			// Raw sockets need CAP_NET_RAW (EPERM); the filter refuses the
			// other families (EAFNOSUPPORT); ping sockets are off in a
			// fresh network namespace (EACCES).
			wantOK(t, o, lines("raw icmp EPERM", "raw tcp EPERM", "raw ipv6 EPERM", "packet EAFNOSUPPORT",
				"vsock EAFNOSUPPORT", "bluetooth EAFNOSUPPORT", "alg EAFNOSUPPORT", "pf_key EAFNOSUPPORT",
				"can EAFNOSUPPORT", "ping EACCES"))
		},
	},
	{
		name: "netlink_reconfigure_network",
		code: withProbes(`
import fcntl, socket, struct
print("interfaces", socket.if_nameindex())
s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
s.bind((0, 0))
def rtattr(kind, data):
    pad = b"\0" * ((4 - len(data) % 4) % 4)
    return struct.pack("=HH", 4 + len(data), kind) + data + pad
def request(label, msg_type, body):
    flags = 0x1 | 0x4 | 0x400 | 0x200  # REQUEST ACK CREATE EXCL
    s.send(struct.pack("=IHHII", 16 + len(body), msg_type, flags, 1, 0) + body)
    data = s.recv(65536)
    typ = struct.unpack("=H", data[4:6])[0]
    err = struct.unpack("=i", data[16:20])[0] if typ == 2 else None
    print(label, "ok" if err == 0 else _errno.errorcode.get(-err, err) if err else "type %d" % typ)
request("add address", 20, struct.pack("=BBBBI", socket.AF_INET, 8, 0, 0, 1) + rtattr(2, socket.inet_aton("10.0.0.2")))
request("add link", 16, struct.pack("=BxHiII", 0, 0, 0, 0, 0) + rtattr(3, b"evil0\0") + rtattr(18, rtattr(1, b"dummy\0")))
request("add route", 24, struct.pack("=BBBBBBBBI", socket.AF_INET, 0, 0, 0, 254, 4, 0, 1, 0) + rtattr(5, socket.inet_aton("10.0.0.1")))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
attempt("lo down", fcntl.ioctl, u, 0x8914, struct.pack("16sH14x", b"lo", 0))
print("interfaces after", socket.if_nameindex())
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("interfaces [(1, 'lo')]", "add address EPERM", "add link EPERM", "add route EPERM",
				"lo down EPERM", "interfaces after [(1, 'lo')]"))
		},
	},
	{
		name: "sandbox_listener_not_reachable_from_host",
		code: `
import os, socket, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(os.environ["PORT"])))
s.listen()
s.setblocking(False)
print("listening", flush=True)
n = 0
deadline = time.time() + 3
while time.time() < deadline and not os.path.exists("/tmp/never"):
    try:
        s.accept()
        n += 1
    except BlockingIOError:
        time.sleep(0.05)
print("accepted", n)
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			// A port free on the host, so that the host's attempt meets
			// nothing but what the sandbox might leak.
			port := freePort(t)
			j.vars["PORT"] = fmt.Sprint(port)
			var once sync.Once
			dialed := make(chan error, 1)
			var seen bytes.Buffer
			j.Sink = stdoutSink(func(p []byte) {
				seen.Write(p)
				if strings.Contains(seen.String(), "listening\n") {
					once.Do(func() {
						go func() {
							c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 2*time.Second)
							if err == nil {
								c.Close()
							}
							dialed <- err
						}()
					})
				}
			})
			t.Cleanup(func() {
				select {
				case err := <-dialed:
					if !errors.Is(err, syscall.ECONNREFUSED) {
						t.Errorf("the host dialled the sandbox's port %d: %v, want connection refused", port, err)
					}
				default:
					t.Errorf("the host never dialled: the sandbox did not report listening")
				}
			})
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("listening", "accepted 0"))
		},
	},
}

// counting is a host listener that counts the connections it accepts.
type counting struct {
	addr net.Addr
	n    atomic.Int64
}

func listenCounting(t *testing.T, network, addr string) *counting {
	t.Helper()
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	c := &counting{addr: l.Addr()}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			c.n.Add(1)
			conn.Close()
		}
	}()
	return c
}

// stdoutSink passes stdout to a function and drops stderr. Only one
// goroutine calls it at a time: the one reading stdout.
type stdoutSink func([]byte)

func (f stdoutSink) Stdout(p []byte) { f(p) }
func (f stdoutSink) Stderr([]byte)   {}
