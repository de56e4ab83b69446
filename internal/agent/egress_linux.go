package agent

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// A sandbox's network access (sandbox.Egress) in a container: the
// supervisor's proxy cannot listen in the sandbox's network stack (under
// gVisor it is the Sentry's, in no namespace of the host), so the agent
// listens at Config.Egress (sandbox.EgressAddr) before the runner or any
// command starts, and passes each connection accepted there to the
// supervisor on a stream of its own (OpConnect, then data both ways on
// EgressStream(id); KindClose from either side ends the connection). The
// proxy, on the host, decides every connection; the sandbox's stack still
// has no route out.

// EgressStream is the stream of the egress connection id, both ways.
func EgressStream(id uint32) uint32 { return streamEgressBase + id }

// IsEgressStream tells whether stream is an egress connection's.
func IsEgressStream(stream uint32) bool { return stream >= streamEgressBase }

// streamEgressBase + id: an egress connection's bytes, either way.
const streamEgressBase = 1 << 30

// egress is the agent's side of the proxy's connections.
type egress struct {
	out   *Writer
	mu    sync.Mutex
	next  uint32
	conns map[uint32]*egressConn // by stream
	held  bool                   // reset: connections are closed as they come, until release
}

// egressConn is one connection the sandbox made to the proxy.
type egressConn struct {
	c net.Conn
	q *queue // bytes from the supervisor, written to c
}

// listenEgress starts accepting the sandbox's connections to the proxy at
// addr; nil where the sandbox has no network access.
//
// The listening socket is used with plain blocking system calls, never
// Go's poller: a socket registered with epoll has a waiter for as long
// as it is open, and gVisor refuses to checkpoint a TCP endpoint that has
// one ("endpoint still has waiters upon save"); a thread blocked in
// accept is interrupted for the checkpoint, its waiter gone, and its call
// restarted after the restore. The accepted connections do use the
// poller: every one is ended before a checkpoint (reset).
func listenEgress(addr string, out *Writer) (*egress, error) {
	if addr == "" {
		return nil, nil
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		return nil, fmt.Errorf("the proxy's address %q is not an IPv4 address and port", addr)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind %s: %w", addr, err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("listen: %w", err)
	}
	e := &egress{out: out, conns: map[uint32]*egressConn{}}
	go e.accept(fd)
	return e, nil
}

func (e *egress) accept(fd int) {
	for {
		nfd, _, err := unix.Accept4(fd, unix.SOCK_CLOEXEC)
		switch {
		case err == unix.EINTR || err == unix.ECONNABORTED || err == unix.EMFILE || err == unix.ENFILE:
			continue
		case err != nil:
			return
		}
		e.mu.Lock()
		if e.held {
			// Between a reset and the checkpoint's end: nothing that
			// could not be saved is made.
			e.mu.Unlock()
			unix.Close(nfd)
			continue
		}
		f := os.NewFile(uintptr(nfd), "egress")
		c, err := net.FileConn(f) // a duplicate; f's own descriptor is closed
		f.Close()
		if err != nil {
			e.mu.Unlock()
			continue
		}
		e.next++
		stream := EgressStream(e.next % (1<<32 - streamEgressBase))
		ec := &egressConn{c: c, q: newConnQueue(c)}
		e.conns[stream] = ec
		e.mu.Unlock()
		e.out.Ctl(Ctl{Op: OpConnect, ID: stream})
		go e.forward(stream, ec)
	}
}

// forward passes what the sandbox sends on one connection to the
// supervisor until the sandbox closes it (or it is reset), then tells
// the end.
func (e *egress) forward(stream uint32, ec *egressConn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := ec.c.Read(buf)
		if n > 0 {
			if e.out.Write(KindData, stream, buf[:n]) != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	e.out.Write(KindClose, stream, nil)
	// The other way ends with the supervisor's KindClose (or a reset):
	// a client that closed only its write side still reads the answer.
	<-ec.q.done
	ec.c.Close()
	e.mu.Lock()
	if e.conns[stream] == ec {
		delete(e.conns, stream)
	}
	e.mu.Unlock()
}

// data passes the supervisor's bytes for stream on to its connection; a
// KindClose closes the connection's write side once what came before is
// written.
func (e *egress) data(f Frame) {
	e.mu.Lock()
	ec := e.conns[f.Stream]
	e.mu.Unlock()
	if ec == nil {
		return
	}
	if f.Kind == KindClose {
		ec.q.close()
		return
	}
	ec.q.push(f.Data)
}

// reset ends every connection, and closes those that come until release,
// before a checkpoint: the proxy's side of them does not survive it, and
// a client that finds its connection closed makes a new one.
func (e *egress) reset() {
	e.mu.Lock()
	conns := e.conns
	e.conns, e.held = map[uint32]*egressConn{}, true
	e.mu.Unlock()
	for _, ec := range conns {
		ec.c.Close()
		ec.q.close()
	}
}

// release accepts connections again, after a checkpoint (or a failed
// one the container survived).
func (e *egress) release() {
	e.mu.Lock()
	e.held = false
	e.mu.Unlock()
}
