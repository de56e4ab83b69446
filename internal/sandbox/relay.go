package sandbox

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"
)

// RelayPort is a PortDialer for sandboxes whose network the host cannot
// enter (gVisor's own network stack; a container's): each connection is a
// small relay started inside the sandbox with Start, as the sandbox's
// user, that connects to the port on the sandbox's loopback and passes
// bytes between it and its standard input and output. It reaches what the
// sandbox's own code reaches, and nothing more; the sandbox's code can
// end it or read its traffic, which is the sandbox's own.
//
// The relay answers one line first: "OK", or "E" and the errno of the
// connect (ECONNREFUSED: ErrPortClosed). A connection costs a process of
// the sandbox (within its pids limit) and a Python start.
func RelayPort(ctx context.Context, sb Sandbox, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("%w: port %d is not a TCP port (1-65535)", ErrInvalidSpec, port)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	p, err := sb.Start(ctx, Command{Argv: []string{"python3", "-I", "-S", "-c", relayScript, fmt.Sprint(port)}, Dir: "/"})
	if err != nil {
		return nil, fmt.Errorf("start a relay in the sandbox: %w", err)
	}
	go io.Copy(io.Discard, p.Stderr())
	out := bufio.NewReaderSize(p.Stdout(), 64<<10)
	stop := func() {
		p.Signal(syscall.SIGKILL)
		p.Stdin().Close()
	}
	kill := func() {
		stop()
		p.Stdout().Close()
	}
	type answer struct {
		line string
		err  error
	}
	ch := make(chan answer, 1)
	go func() {
		line, err := out.ReadSlice('\n')
		ch <- answer{string(line), err}
	}()
	var a answer
	select {
	case a = <-ch:
	case <-ctx.Done():
		kill()
		return nil, ctx.Err()
	}
	switch {
	case a.err != nil:
		kill()
		return nil, fmt.Errorf("the relay in the sandbox ended before it connected (the sandbox may be out of processes): %w", a.err)
	case a.line == "OK\n":
	case a.line == fmt.Sprintf("E%d\n", syscall.ECONNREFUSED):
		kill()
		return nil, fmt.Errorf("%w (port %d)", ErrPortClosed, port)
	default:
		kill()
		return nil, fmt.Errorf("the relay in the sandbox could not connect to port %d: %q", port, strings.TrimSpace(a.line))
	}
	// The caller's end is one of a pipe, for deadlines; the other end is
	// copied to and from the relay.
	ours, theirs := net.Pipe()
	go func() {
		io.Copy(p.Stdin(), theirs)
		p.Stdin().Close() // the caller closed, or half-closed: shut the relay's way in
	}()
	go func() {
		io.Copy(theirs, out)
		theirs.Close()
		kill()
	}()
	return &relayConn{Conn: ours, stop: stop}, nil
}

type relayConn struct {
	net.Conn
	stop func()
}

func (c *relayConn) Close() error {
	err := c.Conn.Close()
	c.stop()
	return err
}

// relayScript is the relay; argv[1] is the port. Standard library only,
// isolated mode (-I -S): nothing of the sandbox's files is imported.
const relayScript = `
import errno, os, socket, sys, threading
port = int(sys.argv[1])
conn, err = None, 0
for family, addr in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect((addr, port))
        conn = s
        break
    except OSError as e:
        if err != errno.ECONNREFUSED:
            err = e.errno or 0
        s.close()
if conn is None:
    os.write(1, b"E%d\n" % err)
    sys.exit(0)
conn.settimeout(None)
def write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]
os.write(1, b"OK\n")
def inbound():
    while True:
        data = os.read(0, 65536)
        if not data:
            break
        conn.sendall(data)
    try:
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass
threading.Thread(target=inbound, daemon=True).start()
while True:
    data = conn.recv(65536)
    if not data:
        break
    write_all(1, data)
`
