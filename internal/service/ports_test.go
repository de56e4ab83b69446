package service

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/store"
)

// portBackend makes sandboxes whose ports are pipes; withPorts false makes
// sandboxes that have none (another backend).
type portBackend struct{ withPorts bool }

func (portBackend) Name() string { return "ports" }

func (b portBackend) Create(context.Context, sandbox.Spec) (sandbox.Sandbox, error) {
	if b.withPorts {
		return &portSandbox{}, nil
	}
	return &plainSandbox{}, nil
}

// plainSandbox is a sandbox with nothing but Close and ID.
type plainSandbox struct{ sandbox.Sandbox }

func (*plainSandbox) Close() error { return nil }

func (*plainSandbox) ID() string { return "plain" }

type portSandbox struct {
	plainSandbox
	mu     sync.Mutex
	closed bool
	peers  []net.Conn // the sandbox's ends
}

func (p *portSandbox) DialPort(_ context.Context, port int) (net.Conn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, sandbox.ErrClosed
	}
	if port != 8000 {
		return nil, sandbox.ErrPortClosed
	}
	ours, theirs := net.Pipe()
	p.peers = append(p.peers, theirs)
	return ours, nil
}

func (p *portSandbox) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, c := range p.peers {
		c.Close()
	}
	return nil
}

// A port token opens one port of one sandbox of one owner.
func TestPortTokens(t *testing.T) {
	svc := New(Config{Backend: portBackend{withPorts: true}})
	defer svc.Close()
	a, err := svc.Create(context.Background(), CreateRequest{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := svc.Create(context.Background(), CreateRequest{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := svc.PortToken("alice", a.ID, 8000)
	if err != nil {
		t.Fatal(err)
	}
	if owner, ok := svc.PortTokenOwner(tok, a.ID, 8000); !ok || owner != "alice" {
		t.Fatalf("the token does not open its port: %q %v", owner, ok)
	}
	other, _ := svc.PortToken("alice", a.ID, 8001)
	bobs, err := svc.Create(context.Background(), CreateRequest{Owner: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	forged, _ := svc.PortToken("bob", bobs.ID, 8000)
	for name, c := range map[string]struct {
		tok, id string
		port    int
	}{
		"another port":       {tok, a.ID, 8001},
		"another port's":     {other, a.ID, 8000},
		"another sandbox":    {tok, b.ID, 8000},
		"another owner":      {forged, a.ID, 8000},
		"empty":              {"", a.ID, 8000},
		"no prefix":          {tok[len(portTokenPrefix):], a.ID, 8000},
		"truncated":          {tok[:len(tok)-1], a.ID, 8000},
		"port out of range":  {tok, a.ID, 8000 + 65536},
		"no sandbox":         {tok, "", 8000},
		"longer":             {tok + "A", a.ID, 8000},
		"nothing but prefix": {portTokenPrefix, a.ID, 8000},
		"another prefix":     {accessTokenPrefix + tok[len(portTokenPrefix):], a.ID, 8000},
	} {
		if _, ok := svc.PortTokenOwner(c.tok, c.id, c.port); ok {
			t.Errorf("%s: the token opens port %d of %s", name, c.port, c.id)
		}
	}
	if _, err := svc.PortToken("bob", a.ID, 8000); !errors.Is(err, ErrNotFound) {
		t.Errorf("a token for another owner's sandbox: %v", err)
	}
	if _, err := svc.PortToken("alice", a.ID, 0); !errors.Is(err, sandbox.ErrInvalidSpec) {
		t.Errorf("port 0: %v", err)
	}
}

// Connections to a sandbox's ports are bounded, and closed with it.
func TestDialPortBoundsAndClose(t *testing.T) {
	svc := New(Config{Backend: portBackend{withPorts: true}})
	defer svc.Close()
	info, err := svc.Create(context.Background(), CreateRequest{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.DialPort(context.Background(), "bob", info.ID, 8000); !errors.Is(err, ErrNotFound) {
		t.Errorf("another owner's sandbox: %v", err)
	}
	if _, err := svc.DialPort(context.Background(), "alice", info.ID, 8001); !errors.Is(err, sandbox.ErrPortClosed) {
		t.Errorf("a port nothing listens on: %v", err)
	}
	var conns []net.Conn
	for range MaxPortConns {
		c, err := svc.DialPort(context.Background(), "alice", info.ID, 8000)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	if _, err := svc.DialPort(context.Background(), "alice", info.ID, 8000); !errors.Is(err, ErrQuota) {
		t.Fatalf("one connection too many: %v", err)
	}
	conns[0].Close()
	conns[0].Close() // twice: counted once
	c, err := svc.DialPort(context.Background(), "alice", info.ID, 8000)
	if err != nil {
		t.Fatalf("after one closed: %v", err)
	}
	conns[0] = c
	if err := svc.Delete("alice", info.ID); err != nil {
		t.Fatal(err)
	}
	for i, c := range conns {
		if _, err := c.Write([]byte("x")); err == nil {
			t.Fatalf("connection %d still open after the sandbox closed", i)
		}
	}
	svc.ports.mu.Lock()
	left := len(svc.ports.conns)
	svc.ports.mu.Unlock()
	if left != 0 {
		t.Errorf("connections of a closed sandbox still counted: %d", left)
	}
}

// A backend whose sandboxes cannot be dialled says so.
func TestDialPortUnsupported(t *testing.T) {
	svc := New(Config{Backend: portBackend{}})
	defer svc.Close()
	info, err := svc.Create(context.Background(), CreateRequest{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.DialPort(context.Background(), "alice", info.ID, 8000); !errors.Is(err, sandbox.ErrUnsupported) {
		t.Errorf("DialPort: %v", err)
	}
	if _, err := svc.PortToken("alice", info.ID, 8000); !errors.Is(err, sandbox.ErrUnsupported) {
		t.Errorf("PortToken: %v", err)
	}
}

// Each connection to a port is audited when it closes, and each refused
// one when it is refused.
func TestPortConnectionsAudited(t *testing.T) {
	var mu sync.Mutex
	var records []store.Record
	svc := New(Config{Backend: portBackend{withPorts: true}, Audit: func(r store.Record) {
		mu.Lock()
		defer mu.Unlock()
		records = append(records, r)
	}})
	defer svc.Close()
	info, err := svc.Create(context.Background(), CreateRequest{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := svc.DialPort(context.Background(), "alice", info.ID, 8000)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		c.Write([]byte("ping"))
		c.Close()
	}()
	box, _ := svc.Get("alice", info.ID)
	peer := box.sb.(*portSandbox).peers[0]
	io.ReadFull(peer, make([]byte, 4))
	svc.DialPort(context.Background(), "alice", info.ID, 8001)
	mu.Lock()
	defer mu.Unlock()
	for deadline := time.Now().Add(10 * time.Second); len(records) < 2 && time.Now().Before(deadline); {
		mu.Unlock()
		time.Sleep(10 * time.Millisecond)
		mu.Lock()
	}
	if len(records) != 2 {
		t.Fatalf("%+v", records)
	}
	for _, r := range records {
		if r.Kind != "port" || r.KeyID != "alice" || r.SandboxID != info.ID {
			t.Errorf("%+v", r)
		}
		switch r.Port {
		case 8000:
			if r.Status != "ok" || r.BytesOut != 4 {
				t.Errorf("%+v", r)
			}
		case 8001:
			if r.Status != "refused" {
				t.Errorf("%+v", r)
			}
		}
	}
}
