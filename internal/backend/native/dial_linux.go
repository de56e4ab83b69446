package native

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// A sandbox's ports are reached from the host by sockets made inside its
// network namespace: a socket belongs for its whole life to the namespace
// of the thread that created it, so a connection it makes to 127.0.0.1
// reaches the sandbox's own loopback and nothing else (never the host's
// loopback, another sandbox, or the server's own port). The sandbox keeps
// its namespace as it is: no route out, no address but loopback.

var _ sandbox.PortDialer = (*Sandbox)(nil)

// dialTimeout bounds a connect without a deadline of its own. On a
// loopback it is answered at once (accepted or refused); only a listener
// whose backlog is full makes it wait.
const dialTimeout = 10 * time.Second

// netnsRef is a sandbox's network namespace, held open from the start of
// the sandbox (while its init's pid cannot name another process) until it
// closes: a later open by pid could name another sandbox's init.
type netnsRef struct {
	mu sync.RWMutex
	f  *os.File // nil once closed
}

func (n *netnsRef) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.f != nil {
		n.f.Close()
		n.f = nil
	}
}

// DialPort implements sandbox.PortDialer.
func (s *Sandbox) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("%w: port %d is not a TCP port (1-65535)", sandbox.ErrInvalidSpec, port)
	}
	if s.spec.Egress != nil && fmt.Sprintf("127.0.0.1:%d", port) == sandbox.EgressAddr {
		// The supervisor's proxy, not the sandbox's: from outside it
		// would be a way out through the sandbox's network policy.
		return nil, fmt.Errorf("%w: port %d is the sandbox's network proxy, not one of its servers", sandbox.ErrPortClosed, port)
	}
	if s.Core.Paused() {
		return nil, sandbox.ErrPaused
	}
	if isClosed(s.dead()) {
		return nil, sandbox.ErrClosed
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, dialTimeout)
		defer cancel()
	}
	v4, v6, err := s.socketsIn()
	if err != nil {
		return nil, err
	}
	c, err := connectLoopback(ctx, v4, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}})
	if errors.Is(err, unix.ECONNREFUSED) && v6 >= 0 {
		// A server bound to ::1 only.
		c, err = connectLoopback(ctx, v6, &unix.SockaddrInet6{Port: port, Addr: [16]byte{15: 1}})
	} else if v6 >= 0 {
		unix.Close(v6)
	}
	if errors.Is(err, unix.ECONNREFUSED) {
		return nil, fmt.Errorf("%w (port %d)", sandbox.ErrPortClosed, port)
	}
	if err != nil {
		return nil, fmt.Errorf("connect to port %d in the sandbox: %w", port, err)
	}
	return c, nil
}

// socketsIn makes two TCP sockets, IPv4 and IPv6 (-1 where the sandbox has
// no IPv6), in the sandbox's network namespace. In order, on a goroutine
// locked to its OS thread:
//  1. open this thread's own network namespace, to come back to;
//  2. setns(sandbox's, CLONE_NEWNET): this thread, and only it, enters;
//  3. socket, twice: each belongs to the sandbox's namespace for life;
//  4. setns back, and only then unlock the thread, so that no other
//     goroutine ever runs in the sandbox's namespace. If the way back
//     fails, the goroutine parks forever, keeping its thread (see
//     listenIn for why the thread is not left to exit).
func (s *Sandbox) socketsIn() (v4, v6 int, err error) {
	s.netns.mu.RLock()
	defer s.netns.mu.RUnlock()
	if s.netns.f == nil {
		return -1, -1, sandbox.ErrClosed
	}
	ns := int(s.netns.f.Fd())
	type result struct {
		v4, v6 int
		err    error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, -1, fmt.Errorf("open the supervisor's network namespace: %w", err)}
			return
		}
		defer home.Close()
		r := result{-1, -1, nil}
		if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
			r.err = fmt.Errorf("enter the sandbox's network namespace: %w", err)
		} else {
			const flags = unix.SOCK_STREAM | unix.SOCK_CLOEXEC | unix.SOCK_NONBLOCK
			if r.v4, err = unix.Socket(unix.AF_INET, flags, 0); err != nil {
				r.v4, r.err = -1, fmt.Errorf("socket in the sandbox: %w", err)
			}
			if fd, err := unix.Socket(unix.AF_INET6, flags, 0); err == nil {
				r.v6 = fd
			}
		}
		if serr := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); serr != nil {
			for _, fd := range []int{r.v4, r.v6} {
				if fd >= 0 {
					unix.Close(fd)
				}
			}
			ch <- result{-1, -1, fmt.Errorf("return to the supervisor's network namespace: %w", serr)}
			select {} // never run anything else on this thread
		}
		runtime.UnlockOSThread()
		if r.err != nil && r.v6 >= 0 {
			unix.Close(r.v6)
			r.v6 = -1
		}
		ch <- r
	}()
	r := <-ch
	return r.v4, r.v6, r.err
}

// connectLoopback connects the non-blocking socket fd (which it owns) to
// sa, waiting in the runtime's poller until ctx is done.
func connectLoopback(ctx context.Context, fd int, sa unix.Sockaddr) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), "port") // registered with the poller: fd is non-blocking
	defer f.Close()
	err := unix.Connect(fd, sa)
	if errors.Is(err, unix.EINPROGRESS) {
		err = awaitConnect(ctx, f)
	}
	if err != nil {
		return nil, err
	}
	return net.FileConn(f) // a duplicate; f's own descriptor is closed
}

func awaitConnect(ctx context.Context, f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok {
		f.SetWriteDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { f.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	// The callback runs before the first wait: on a loopback the connect
	// may be answered before the poller was armed, and the edge that said
	// so would never come again.
	var soErr error
	werr := rc.Write(func(fd uintptr) bool {
		n, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			soErr = err
			return true
		}
		switch e := unix.Errno(n); e {
		case unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
			return false
		case 0:
			if _, err := unix.Getpeername(int(fd)); err != nil {
				return false // not connected yet
			}
			soErr = nil
			return true
		default:
			soErr = e
			return true
		}
	})
	if werr != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return werr
	}
	return soErr
}
