package native_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// serveIn starts python's http.server in sb on port, bound to bind, and
// waits until it answers through DialPort.
func serveIn(t *testing.T, sb sandbox.Sandbox, port int, bind string) {
	t.Helper()
	p, err := sb.Start(context.Background(), sandbox.Command{Argv: []string{"python3", "-m", "http.server",
		fmt.Sprint(port), "--bind", bind, "--directory", "/workspace"}})
	if err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, p.Stdout())
	errs := make(chan string, 1)
	go func() { b, _ := io.ReadAll(p.Stderr()); errs <- string(b) }()
	d := sb.(sandbox.PortDialer)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		c, err := d.DialPort(context.Background(), port)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-p.Done():
			t.Fatalf("the server on port %d exited with %d: %s", port, p.ExitCode(), <-errs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server on port %d does not answer: %v", port, err)
		}
	}
}

func get(t *testing.T, d sandbox.PortDialer, port int, path string) (int, string) {
	t.Helper()
	c, err := d.DialPort(context.Background(), port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: x\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// A server the sandbox's code started is reached through DialPort, on
// 127.0.0.1, 0.0.0.0 or ::1; what is not the sandbox's is never reached:
// not the host's loopback, not another sandbox's server.
func TestDialPort(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	a, err := b.Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	other, err := b.Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := a.Workspace().WriteFile("hello.txt", strings.NewReader("hello from a"), 1<<20); err != nil {
		t.Fatal(err)
	}
	serveIn(t, a, 8000, "127.0.0.1")
	serveIn(t, a, 8001, "0.0.0.0")
	serveIn(t, a, 8002, "::1")
	da := a.(sandbox.PortDialer)
	for _, port := range []int{8000, 8001, 8002} {
		if code, body := get(t, da, port, "/hello.txt"); code != 200 || body != "hello from a" {
			t.Errorf("port %d: %d %q", port, code, body)
		}
	}

	// The host's loopback: a listener there is never reached.
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := host.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	hostPort := host.Addr().(*net.TCPAddr).Port
	if c, err := da.DialPort(context.Background(), hostPort); !errors.Is(err, sandbox.ErrPortClosed) {
		if c != nil {
			c.Close()
		}
		t.Errorf("a port of the host's loopback: %v", err)
	}
	// Another sandbox's server, on its own loopback.
	if c, err := other.(sandbox.PortDialer).DialPort(context.Background(), 8000); !errors.Is(err, sandbox.ErrPortClosed) {
		if c != nil {
			c.Close()
		}
		t.Errorf("another sandbox's port: %v", err)
	}
	for _, port := range []int{0, -1, 65536} {
		if _, err := da.DialPort(context.Background(), port); !errors.Is(err, sandbox.ErrInvalidSpec) {
			t.Errorf("port %d: %v", port, err)
		}
	}
	host.Close()
	select {
	case <-accepted:
		t.Error("the host's listener accepted a connection")
	default:
	}

	// A closed sandbox has no ports; a connection it served ends.
	c, err := da.DialPort(context.Background(), 8000)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a.Close()
	if _, err := da.DialPort(context.Background(), 8000); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		t.Errorf("a connection to a closed sandbox: %v", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// The proxy of a sandbox with network access listens on its loopback
// too, but is the supervisor's: DialPort does not hand it out.
func TestDialPortNotTheEgressProxy(t *testing.T) {
	t.Parallel()
	w := newEgressWorld(t)
	b := newBackend(t)
	sb, err := b.Create(context.Background(), sandbox.Spec{Egress: w.proxy(t, "example.com")})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	_, port, _ := net.SplitHostPort(sandbox.EgressAddr)
	var n int
	fmt.Sscan(port, &n)
	if _, err := sb.(sandbox.PortDialer).DialPort(context.Background(), n); !errors.Is(err, sandbox.ErrPortClosed) {
		t.Errorf("the egress proxy's port: %v", err)
	}
}
