package native

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// A sandbox with network access keeps its network namespace as it is,
// loopback only and no route out. The supervisor binds a listening socket
// inside that namespace, at sandbox.EgressAddr, and serves the sandbox's
// proxy (Spec.Egress) on it from the host: the proxy's own connections
// out are the host's, made only after the policy allowed them.

// EgressSupported implements sandbox.EgressBackend.
func (b *Backend) EgressSupported() error { return nil }

var _ sandbox.EgressBackend = (*Backend)(nil)

// openNetns opens the network namespace of a sandbox's init. It must be
// called while init cannot have been reaped (a classic init before its
// wait begins) or with a pidfd that proves it still runs after the open
// (a zygote's init): either way the pid cannot name another process.
func openNetns(p *initProc) (*os.File, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", p.pid))
	if err != nil {
		return nil, fmt.Errorf("open the sandbox's network namespace: %w", err)
	}
	if p.pidfd >= 0 {
		if err := unix.PidfdSendSignal(p.pidfd, 0, nil, 0); err != nil {
			f.Close()
			return nil, fmt.Errorf("the sandbox's init exited before its network was set up: %w", err)
		}
	}
	// Never the supervisor's own namespace: a listener there would offer
	// the proxy to the whole host.
	var ours, theirs unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &ours); err != nil {
		f.Close()
		return nil, err
	}
	if err := unix.Fstat(int(f.Fd()), &theirs); err != nil {
		f.Close()
		return nil, err
	}
	if ours.Dev == theirs.Dev && ours.Ino == theirs.Ino {
		f.Close()
		return nil, errors.New("the sandbox shares the supervisor's network namespace")
	}
	return f, nil
}

// listenIn binds a TCP listener at sandbox.EgressAddr in the network
// namespace ns. In order, on a goroutine locked to its OS thread:
//  1. open this thread's own network namespace, to come back to;
//  2. setns(ns, CLONE_NEWNET): this thread, and only it, enters the
//     sandbox's network namespace;
//  3. bring lo up (init does too; whichever comes first);
//  4. socket, bind, listen: the socket belongs to the sandbox's
//     namespace for its whole life, whatever thread later uses it;
//  5. setns back to the namespace of step 1, and only then unlock the
//     thread, so that no other goroutine ever runs in the sandbox's
//     namespace.
//
// The thread is restored rather than left to die with its goroutine:
// the kernel sends a child's parent-death signal when the thread that
// forked it exits, and this thread may be the one that started some
// sandbox's init (Pdeathsig), which would then be killed. If the way
// back fails, the goroutine parks forever, keeping its thread.
func listenIn(ns *os.File) (net.Listener, error) {
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, fmt.Errorf("open the supervisor's network namespace: %w", err)}
			return
		}
		defer home.Close()
		fd, err := bindInNetns(int(ns.Fd()))
		if serr := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); serr != nil {
			if fd >= 0 {
				unix.Close(fd)
			}
			ch <- result{-1, fmt.Errorf("return to the supervisor's network namespace: %w", serr)}
			select {} // step 5: never run anything else on this thread
		}
		runtime.UnlockOSThread()
		ch <- result{fd, err}
	}()
	r := <-ch
	if r.err != nil {
		return nil, r.err
	}
	f := os.NewFile(uintptr(r.fd), "egress")
	defer f.Close()
	l, err := net.FileListener(f) // a duplicate; f's own descriptor is closed
	if err != nil {
		return nil, fmt.Errorf("egress listener: %w", err)
	}
	return l, nil
}

func bindInNetns(ns int) (int, error) {
	if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
		return -1, fmt.Errorf("enter the sandbox's network namespace: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return -1, fmt.Errorf("loopback up in the sandbox: %w", err)
	}
	ap, err := netip.ParseAddrPort(sandbox.EgressAddr)
	if err != nil {
		return -1, err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return -1, fmt.Errorf("egress socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind %s in the sandbox: %w", sandbox.EgressAddr, err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("listen in the sandbox: %w", err)
	}
	return fd, nil
}
