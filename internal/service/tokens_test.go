package service

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

// revocations is a key list for KeyRevoked: what is revoked, and with
// its sandboxes or not.
type revocations struct {
	mu sync.Mutex
	m  map[string]bool // owner → close its sandboxes
}

func (r *revocations) revoke(owner string, closeSandboxes bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[owner] = closeSandboxes
}

func (r *revocations) state(owner string) (bool, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.m[owner]
	return ok, c
}

// Every kind of token opens its one object, carries no owner, and opens
// nothing once its key is revoked, its object is gone or it is rotated.
func TestTokens(t *testing.T) {
	keys := &revocations{m: map[string]bool{}}
	svc := New(Config{Backend: portBackend{withPorts: true}, KeyRevoked: keys.state})
	defer svc.Close()
	ctx := context.Background()
	a, err := svc.Create(ctx, CreateRequest{Owner: "key_alice"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := svc.Create(ctx, CreateRequest{Owner: "key_bob"})
	if err != nil {
		t.Fatal(err)
	}
	access, err := svc.AccessToken("key_alice", a.ID)
	if err != nil {
		t.Fatal(err)
	}
	port, err := svc.PortToken("key_alice", a.ID, 8000)
	if err != nil {
		t.Fatal(err)
	}
	bobs, _ := svc.AccessToken("key_bob", b.ID)
	for _, tok := range []string{access, port, bobs, svc.VolumeToken("key_alice", "vol_1")} {
		if strings.Contains(tok, "alice") || strings.Contains(tok, "bob") {
			t.Errorf("the token %q names its owner", tok)
		}
	}
	if _, err := svc.AccessToken("key_bob", a.ID); err == nil {
		t.Error("another owner got a sandbox's access token")
	}

	opens := func(tok, id string) bool {
		_, ok, _ := svc.AccessTokenOwner(tok, id)
		return ok
	}
	if owner, ok, gone := svc.AccessTokenOwner(access, a.ID); !ok || gone || owner != "key_alice" {
		t.Fatalf("the access token: %q %v %v", owner, ok, gone)
	}
	for name, c := range map[string]struct{ tok, id string }{
		"another sandbox's":    {bobs, a.ID},
		"for another sandbox":  {access, b.ID},
		"a port token":         {port, a.ID},
		"truncated":            {access[:len(access)-1], a.ID},
		"longer":               {access + "A", a.ID},
		"empty":                {"", a.ID},
		"no sandbox":           {access, ""},
		"another server's":     {otherServersToken(t, a.ID), a.ID},
		"an E2B-formed key":    {"e2b_" + strings.Repeat("0", 40), a.ID},
		"nothing but a prefix": {accessTokenPrefix, a.ID},
	} {
		if opens(c.tok, c.id) {
			t.Errorf("%s opens %s", name, c.id)
		}
	}
	if _, ok := svc.AccessTokenOf(a.ID); !ok {
		t.Error("AccessTokenOf a live sandbox")
	}
	if n := len(svc.AccessTokens()); n != 2 {
		t.Errorf("AccessTokens lists %d sandboxes", n)
	}

	// Rotated: the old token opens nothing, the new one does; the
	// port's token is its own.
	rotated, err := svc.RotateAccessToken("key_alice", a.ID)
	if err != nil || rotated == access {
		t.Fatalf("rotate: %q %v", rotated, err)
	}
	if opens(access, a.ID) || !opens(rotated, a.ID) {
		t.Error("after a rotation, the old token opens the sandbox or the new one does not")
	}
	if _, ok := svc.PortTokenOwner(port, a.ID, 8000); !ok {
		t.Error("rotating the access token changed the port's")
	}
	newPort, err := svc.RotatePortToken("key_alice", a.ID, 8000)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := svc.PortTokenOwner(port, a.ID, 8000); ok {
		t.Error("a rotated port token still opens its port")
	}
	if _, ok := svc.PortTokenOwner(newPort, a.ID, 8000); !ok {
		t.Error("the new port token does not open its port")
	}
	if _, err := svc.RotateAccessToken("key_bob", a.ID); err == nil {
		t.Error("another owner rotated a sandbox's token")
	}

	// Revoked, keeping its sandboxes: its tokens open nothing, another
	// key's still do, and the sandboxes live on.
	keys.revoke("key_alice", false)
	if opens(rotated, a.ID) {
		t.Error("a revoked key's access token opens its sandbox")
	}
	if _, ok := svc.PortTokenOwner(newPort, a.ID, 8000); ok {
		t.Error("a revoked key's port token opens its port")
	}
	if _, ok := svc.AccessTokenOf(a.ID); ok {
		t.Error("AccessTokenOf a revoked key's sandbox")
	}
	if got := svc.AccessTokens(); len(got) != 1 || got[0].Owner != "key_bob" {
		t.Errorf("AccessTokens with a key revoked: %v", got)
	}
	if !opens(bobs, b.ID) {
		t.Error("another key's token stopped working")
	}
	if !svc.Exists("key_alice", a.ID) {
		t.Fatal("a key revoked without its sandboxes closed them")
	}

	// Revoked with its sandboxes: they are closed within the reaper's
	// next rounds; the sandbox's token then tells it is gone.
	keys.revoke("key_alice", true)
	deadline := time.Now().Add(30 * time.Second)
	for svc.Exists("key_alice", a.ID) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if svc.Exists("key_alice", a.ID) {
		t.Fatal("a key revoked with its sandboxes: they live on")
	}
	if _, ok, gone := svc.AccessTokenOwner(rotated, a.ID); ok || !gone {
		t.Errorf("the token of a closed sandbox: %v %v", ok, gone)
	}
	if !svc.Exists("key_bob", b.ID) {
		t.Error("another key's sandbox was closed")
	}
}

// otherServersToken is the access token another service (another
// secret) gives a sandbox of the same id and owner.
func otherServersToken(t *testing.T, id string) string {
	other := New(Config{Backend: portBackend{withPorts: true}})
	t.Cleanup(func() { other.Close() })
	return accessTokenPrefix + other.mac("access", "key_alice", id, "0")
}
