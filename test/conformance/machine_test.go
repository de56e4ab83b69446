//go:build linux

package conformance

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

// What a sandbox offers beyond running code: the python command, its
// usage, its servers' ports. Each backend had a copy of these checks.
var machineCases = []conformanceCase{
	{name: "python_command", run: func(t *testing.T, be *backend) {
		sb := be.create(t, sandbox.Spec{})
		p, err := sb.Start(context.Background(), sandbox.Command{Argv: []string{"sh", "-c", "python -c 'print(6 * 7)'"}})
		if err != nil {
			t.Fatal(err)
		}
		p.Stdin().Close()
		errc := make(chan []byte, 1)
		go func() { b, _ := io.ReadAll(p.Stderr()); errc <- b }()
		out, _ := io.ReadAll(p.Stdout())
		<-p.Done()
		if errOut := <-errc; p.ExitCode() != 0 || string(out) != "42\n" {
			t.Fatalf("python: exit %d, stdout %q, stderr %q", p.ExitCode(), out, errOut)
		}
	}},
	{name: "usage", run: func(t *testing.T, be *backend) {
		sb := be.create(t, sandbox.Spec{})
		if res := exec(t, sb, code("x = bytearray(8 << 20); sum(range(10**6))")); res.Status != sandbox.StatusOK {
			t.Fatalf("%+v", res)
		}
		if r, ok := sb.(sandbox.UsageReporter); !ok {
			t.Fatal("the sandbox does not report its usage (sandbox.UsageReporter)")
		} else {
			if u, err := r.Usage(); err != nil || u.CPU <= 0 || u.Memory <= 0 {
				t.Fatalf("usage: %+v %v", u, err)
			}
		}
		if d, ok := sb.Workspace().(sandbox.DiskUser); ok {
			if used, err := d.DiskUsed(); err != nil || used < 0 {
				t.Fatalf("disk: %d %v", used, err)
			}
		}
	}},
	{name: "ports", run: func(t *testing.T, be *backend) {
		sb := be.create(t, sandbox.Spec{})
		d, ok := sb.(sandbox.PortDialer)
		if !ok {
			t.Fatal("the sandbox has no ports (sandbox.PortDialer)")
		}
		if err := sb.Workspace().WriteFile("hello.txt", strings.NewReader("hello from "+be.Name), 1<<20); err != nil {
			t.Fatal(err)
		}
		p, err := sb.Start(context.Background(), sandbox.Command{Argv: []string{"python3", "-m", "http.server", "8000",
			"--bind", "127.0.0.1", "--directory", "/workspace"}})
		if err != nil {
			t.Fatal(err)
		}
		go io.Copy(io.Discard, p.Stdout())
		go io.Copy(io.Discard, p.Stderr())
		var c net.Conn
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if c, err = d.DialPort(context.Background(), 8000); err == nil {
				break
			}
			if !errors.Is(err, sandbox.ErrPortClosed) || time.Now().After(deadline) {
				t.Fatal(err)
			}
		}
		fmt.Fprint(c, "GET /hello.txt HTTP/1.0\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		c.Close()
		if resp.StatusCode != 200 || string(body) != "hello from "+be.Name {
			t.Errorf("the sandbox's server: %d %q", resp.StatusCode, body)
		}
		// The host's loopback is not the sandbox's.
		host, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer host.Close()
		if _, err := d.DialPort(context.Background(), host.Addr().(*net.TCPAddr).Port); !errors.Is(err, sandbox.ErrPortClosed) {
			t.Errorf("a port of the host's loopback: %v", err)
		}
	}},
}

func init() { cases = append(cases, machineCases...) }
