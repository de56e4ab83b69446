package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	snapshotkey "github.com/vivarium-sandbox/vivarium/internal/snapshot"
)

// pause({ keepMemory: false }) and lifecycle onTimeout { action: 'pause',
// keepMemory: false }, as the SDKs send them ({"memory": false}, and
// autoPauseMemory at create): the files are kept, the rest ends, connect
// starts the sandbox afresh with them; on a backend that cannot pause a
// sandbox with its memory too.
func TestPauseWithoutMemory(t *testing.T) {
	svc := service.New(service.Config{Backend: fakeBackend{t.TempDir()}, PausedDir: t.TempDir(),
		SnapshotKey: bytes.Repeat([]byte{1}, snapshotkey.KeySize)})
	t.Cleanup(func() { svc.Close() })
	ts := httptest.NewServer(New(Config{Service: svc, Auth: keys{"key-a": "a"}, Prefix: "/e2b"}))
	t.Cleanup(ts.Close)
	c := client{t, ts.URL}
	key := map[string]string{"X-API-Key": "key-a", "Content-Type": "application/json"}
	state := func(id string) string {
		t.Helper()
		_, body := c.do("GET", "/e2b/sandboxes/"+id, nil, key)
		var d struct {
			State string `json:"state"`
		}
		json.Unmarshal(body, &d)
		return d.State
	}

	sb := c.create("key-a", `{}`)
	ws, done, err := svc.Workspace("a", sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.WriteFile("kept.txt", strings.NewReader("kept"), 10); err != nil {
		t.Fatal(err)
	}
	done()
	// With memory, the fake backend cannot.
	if resp, body := c.do("POST", "/e2b/sandboxes/"+sb.SandboxID+"/pause", strings.NewReader(`{}`), key); resp.StatusCode != http.StatusNotImplemented {
		t.Fatalf("pause: %d %s", resp.StatusCode, body)
	}
	pause := func(want int) {
		t.Helper()
		resp, body := c.do("POST", "/e2b/sandboxes/"+sb.SandboxID+"/pause", strings.NewReader(`{"memory":false}`), key)
		if resp.StatusCode != want {
			t.Fatalf("pause without memory: %d %s, want %d", resp.StatusCode, body, want)
		}
	}
	pause(http.StatusNoContent)
	if got := state(sb.SandboxID); got != "paused" {
		t.Fatalf("state %q", got)
	}
	pause(http.StatusConflict) // the SDKs' pause() answers false
	if resp, body := c.do("POST", "/e2b/sandboxes/"+sb.SandboxID+"/connect", strings.NewReader(`{"timeout":60}`), key); resp.StatusCode/100 != 2 {
		t.Fatalf("connect: %d %s", resp.StatusCode, body)
	}
	if got := state(sb.SandboxID); got != "running" {
		t.Fatalf("state %q after connect", got)
	}
	ws, done, err = svc.Workspace("a", sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	r, _, err := ws.OpenFile("kept.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if buf, _ := io.ReadAll(r); string(buf) != "kept" {
		t.Fatalf("after connect: %q", buf)
	}

	// A timeout that pauses without memory needs no pausable sandbox.
	for body, want := range map[string]int{
		`{"autoPause":true,"autoPauseMemory":false}`: http.StatusCreated,
		`{"autoPause":true,"autoPauseMemory":true}`:  http.StatusNotImplemented,
	} {
		if resp, out := c.do("POST", "/e2b/v2/sandboxes", strings.NewReader(body), key); resp.StatusCode != want {
			t.Errorf("create %s: %d %s, want %d", body, resp.StatusCode, out, want)
		}
	}
}

// unkeptBackend's sandboxes can be paused, but each pause finds something
// it cannot keep.
type unkeptBackend struct{ fakeBackend }

func (b unkeptBackend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := b.fakeBackend.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return unkeptSandbox{sb.(*fakeSandbox)}, nil
}

type unkeptSandbox struct{ *fakeSandbox }

func (unkeptSandbox) Pause(context.Context) error {
	return fmt.Errorf("%w: a process of the sandbox has a TCP connection open", sandbox.ErrCannotKeep)
}
func (unkeptSandbox) Resume(context.Context) error { return nil }
func (unkeptSandbox) Paused() bool                 { return false }
func (unkeptSandbox) PauseSupported() error        { return nil }

// A pause that cannot keep what the sandbox holds answers 501 with why,
// never the 409 E2B's SDKs read as "already paused" (and return false
// from pause() without an error).
func TestPauseCannotKeep(t *testing.T) {
	svc := service.New(service.Config{Backend: unkeptBackend{fakeBackend{t.TempDir()}}})
	t.Cleanup(func() { svc.Close() })
	ts := httptest.NewServer(New(Config{Service: svc, Auth: keys{"key-a": "a"}, Prefix: "/e2b"}))
	t.Cleanup(ts.Close)
	c := client{t, ts.URL}
	sb := c.create("key-a", `{}`)
	resp, body := c.do("POST", "/e2b/sandboxes/"+sb.SandboxID+"/pause", strings.NewReader(`{}`),
		map[string]string{"X-API-Key": "key-a", "Content-Type": "application/json"})
	if resp.StatusCode != http.StatusNotImplemented || !strings.Contains(string(body), "TCP connection") {
		t.Fatalf("a pause that cannot keep the sandbox: %d %s", resp.StatusCode, body)
	}
}
