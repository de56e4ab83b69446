package gvisor_test

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

// A sandbox's ports, through a relay inside gVisor (sandbox.RelayPort):
// its own server answers; the host's loopback is not the sandbox's.
func TestDialPortByRelay(t *testing.T) {
	b := newBackend(t, "vivarium-gvisor-dial-test", t.TempDir())
	defer b.Close()
	sb, err := b.Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if err := sb.Workspace().WriteFile("hello.txt", strings.NewReader("hello from gvisor"), 1<<20); err != nil {
		t.Fatal(err)
	}
	p, err := sb.Start(context.Background(), sandbox.Command{Argv: []string{"python3", "-m", "http.server", "8000",
		"--directory", "/workspace"}})
	if err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, p.Stdout())
	go io.Copy(io.Discard, p.Stderr())
	d := sb.(sandbox.PortDialer)
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
	if resp.StatusCode != 200 || string(body) != "hello from gvisor" {
		t.Errorf("%d %q", resp.StatusCode, body)
	}

	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	if _, err := d.DialPort(context.Background(), host.Addr().(*net.TCPAddr).Port); !errors.Is(err, sandbox.ErrPortClosed) {
		t.Errorf("a port of the host's loopback: %v", err)
	}
}
