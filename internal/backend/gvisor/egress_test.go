package gvisor_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/gvisor"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// tagEgress is a sandbox's proxy that answers each line a connection
// sends with its name and the line: which proxy served the sandbox.
type tagEgress struct {
	name   string
	mu     sync.Mutex
	closed bool
}

func (e *tagEgress) Serve(l net.Listener) error { return l.Close() }

func (e *tagEgress) ServeConn(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		fmt.Fprintf(c, "%s:%s", e.name, line)
	}
}

func (e *tagEgress) Close() error {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	return nil
}

func (e *tagEgress) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// ask is Python that sends a line to the sandbox's proxy and prints the
// answer ("" where the connection is closed without one).
const ask = `import socket
def ask(m):
    with socket.create_connection(("127.0.0.1", 3128), timeout=60) as s:
        s.sendall(m.encode() + b"\n")
        return s.makefile().readline().strip()
`

// A gVisor sandbox with network access reaches its proxy at
// sandbox.EgressAddr (its HTTP clients pointed there), inside gVisor's
// own network stack, through the agent. A connection open when it pauses
// is ended (the proxy's side does not survive the checkpoint), and the
// resumed sandbox makes new ones to the same proxy. Its fork's copies are
// each served by the proxy each is given; a sandbox made of its snapshot
// has none: its connections are closed. Closing a sandbox closes its
// proxy.
func TestEgress(t *testing.T) {
	dir := t.TempDir()
	cps := filepath.Join(t.TempDir(), "checkpoints")
	b := pauseBackend(t, gvisor.Config{StateDir: dir, CheckpointDir: cps})
	if err := sandbox.EgressSupported(b); err != nil {
		t.Fatalf("EgressSupported: %v", err)
	}
	ctx := context.Background()
	src := &tagEgress{name: "src"}
	sb, err := b.Create(ctx, sandbox.Spec{Egress: src})
	if err != nil {
		t.Fatal(err)
	}
	var closers []sandbox.Sandbox
	closers = append(closers, sb)
	defer func() {
		for _, s := range closers {
			s.Close()
		}
	}()
	execValue(t, sb, ask)
	if got := execValue(t, sb, `print(ask("hello"), __import__("os").environ["HTTPS_PROXY"])`); got != "src:hello http://127.0.0.1:3128" {
		t.Fatalf("the proxy's answer and the environment: %q", got)
	}

	// Open across the pause: it ends, and says so, rather than hang.
	execValue(t, sb, `held = socket.create_connection(("127.0.0.1", 3128), timeout=60)`)
	p := sb.(sandbox.Pauser)
	if err := p.Pause(ctx); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if err := p.Resume(ctx); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if got := execValue(t, sb, "try:\n    held.sendall(b'x\\n'); print(repr(held.recv(100)))\n"+
		"except OSError as e:\n    print(type(e).__name__)"); got != "b''" && got != "ConnectionResetError" && got != "BrokenPipeError" {
		t.Errorf("a connection open across the pause: %q, want it ended", got)
	}
	if got := execValue(t, sb, `print(ask("again"))`); got != "src:again" {
		t.Errorf("after the resume: %q", got)
	}

	copies, err := sb.(sandbox.Forker).Fork(ctx, 2, sandbox.ForkOptions{
		Egress: []sandbox.Egress{&tagEgress{name: "copy0"}, &tagEgress{name: "copy1"}}})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	closers = append(closers, copies...)
	for i, c := range copies {
		if got, want := execValue(t, c, `print(ask("fork"))`), fmt.Sprintf("copy%d:fork", i); got != want {
			t.Errorf("copy %d: %q, want %q", i, got, want)
		}
	}
	if got := execValue(t, sb, `print(ask("source"))`); got != "src:source" {
		t.Errorf("the source after its fork: %q", got)
	}

	snap := filepath.Join(t.TempDir(), "snapshot")
	if _, err := sb.(sandbox.Snapshotter).SaveSnapshot(ctx, snap); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	made, err := sandbox.Backend(b).(sandbox.SnapshotRestorer).CreateFromSnapshot(ctx, snap, sandbox.FromSnapshot{})
	if err != nil {
		t.Fatalf("from the snapshot: %v", err)
	}
	closers = append(closers, made)
	if got := execValue(t, made, `print(repr(ask("snapshot")))`); got != "''" {
		t.Errorf("a sandbox made of the snapshot reached a proxy: %s", got)
	}
	if got := execValue(t, sb, `print(ask("still"))`); got != "src:still" {
		t.Errorf("the source after its snapshot: %q", got)
	}

	sb.Close()
	if !src.isClosed() {
		t.Errorf("the sandbox's proxy is open once it closed")
	}
}
