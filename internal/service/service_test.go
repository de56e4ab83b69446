package service

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// specs is a backend that records the specs it is asked for and makes no
// sandbox: what the service hands a backend is what these tests check.
type specs struct {
	mu  sync.Mutex
	got []sandbox.Spec
}

var errRecorded = errors.New("recorded, not made")

func (r *specs) Name() string { return "recorder" }

func (r *specs) Create(_ context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, spec)
	return nil, errRecorded
}

func (r *specs) last(t *testing.T) sandbox.Spec {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.got) == 0 {
		t.Fatal("the backend was not asked for a sandbox")
	}
	return r.got[len(r.got)-1]
}

// Each owner's sandboxes, stateful and one-shot, are asked for in the
// owner's tenant: its id where that is a valid name, a digest otherwise
// (never the owner's text in a path), none without Config.Tenants.
func TestTenantOfOwner(t *testing.T) {
	rec := &specs{}
	svc := New(Config{Backend: rec, Tenants: true})
	defer svc.Close()
	for owner, want := range map[string]string{"key_0a1b2c": "key_0a1b2c", "dev": "dev"} {
		if _, err := svc.Create(context.Background(), CreateRequest{Owner: owner}); !errors.Is(err, errRecorded) {
			t.Fatal(err)
		}
		if got := rec.last(t).Tenant; got != want {
			t.Errorf("Create for %q: tenant %q, want %q", owner, got, want)
		}
		svc.RunOnce(context.Background(), owner, sandbox.OneShot{Request: sandbox.ExecRequest{Code: "1"}})
		if got := rec.last(t); got.Tenant != want || !got.OneShot {
			t.Errorf("RunOnce for %q: tenant %q, want %q", owner, got.Tenant, want)
		}
	}
	odd := "alice@example.com/../x"
	svc.RunOnce(context.Background(), odd, sandbox.OneShot{Request: sandbox.ExecRequest{Code: "1"}})
	got := rec.last(t).Tenant
	if sandbox.ValidTenant(got) != nil || strings.Contains(got, "alice") || got != svc.tenantOf(odd) {
		t.Errorf("owner %q: tenant %q", odd, got)
	}
	if svc.tenantOf("other@example.com") == got {
		t.Error("two owners, one tenant")
	}

	off := New(Config{Backend: rec})
	defer off.Close()
	off.Create(context.Background(), CreateRequest{Owner: "key_0a1b2c"})
	if got := rec.last(t).Tenant; got != "" {
		t.Errorf("without Config.Tenants: tenant %q", got)
	}
	if spec := svc.DefaultSpec("dev", true); spec.Tenant != "dev" || !spec.OneShot {
		t.Errorf("DefaultSpec: %+v", spec)
	}
}

// The server's disk I/O rates are every sandbox's default and the most a
// client may ask for; no limit is possible only on a server without one.
func TestIOLimitBounds(t *testing.T) {
	capped := New(Config{Backend: &specs{}, MaxLimits: sandbox.Limits{IOReadBPS: 64 << 20}})
	defer capped.Close()
	l, err := capped.bound(sandbox.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if l.IOReadBPS != 64<<20 || l.IOReadIOPS != sandbox.DefaultIOReadIOPS || l.IOWriteBPS != sandbox.DefaultIOWriteBPS {
		t.Errorf("defaults: %+v", l)
	}
	if l, err := capped.bound(sandbox.Limits{IOReadBPS: 8 << 20, IOWriteIOPS: 20}); err != nil || l.IOReadBPS != 8<<20 || l.IOWriteIOPS != 20 {
		t.Errorf("less than the server's: %+v %v", l, err)
	}
	for _, bad := range []sandbox.Limits{{IOReadBPS: 65 << 20}, {IOReadBPS: sandbox.NoIOLimit}, {IOWriteIOPS: sandbox.DefaultIOWriteIOPS + 1}} {
		if _, err := capped.bound(bad); !errors.Is(err, sandbox.ErrInvalidSpec) {
			t.Errorf("%+v: want ErrInvalidSpec, got %v", bad, err)
		}
	}

	none := New(Config{Backend: &specs{}, MaxLimits: sandbox.Limits{}.WithoutIOLimit()})
	defer none.Close()
	if l, err := none.bound(sandbox.Limits{}); err != nil || l.IOReadBPS != sandbox.NoIOLimit || l.IOWriteIOPS != sandbox.NoIOLimit {
		t.Errorf("a server without a limit: %+v %v", l, err)
	}
	if l, err := none.bound(sandbox.Limits{IOReadBPS: 1 << 30}); err != nil || l.IOReadBPS != 1<<30 {
		t.Errorf("a client's own limit on a server without one: %+v %v", l, err)
	}
}

// Connecting with a shorter timeout never shortens a sandbox's life; a
// longer one extends it.
func TestExtendTimeoutNeverShortens(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	svc := New(Config{Backend: newFakeBackend(), Now: func() time.Time { return now }})
	defer svc.Close()
	info, err := svc.Create(context.Background(), CreateRequest{Owner: "o", Idle: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got, err := svc.ExtendTimeout("o", info.ID, time.Minute)
	if err != nil || !got.ExpiresAt.Equal(info.ExpiresAt) || got.IdleTimeoutS != 600 {
		t.Fatalf("shorter: expires %v (was %v), idle %vs, %v", got.ExpiresAt, info.ExpiresAt, got.IdleTimeoutS, err)
	}
	got, err = svc.ExtendTimeout("o", info.ID, 20*time.Minute)
	if err != nil || !got.ExpiresAt.Equal(now.Add(20*time.Minute)) || got.IdleTimeoutS != 1200 {
		t.Fatalf("longer: expires %v, idle %vs, %v", got.ExpiresAt, got.IdleTimeoutS, err)
	}
	if _, err := svc.ExtendTimeout("other", info.ID, time.Hour); err != ErrNotFound {
		t.Fatalf("another owner: %v", err)
	}
}

// A sandbox the reaper saw idle is kept when a call began since, or its
// timeout was extended since; it is closed once it is idle again.
func TestTimedOutRechecksIdle(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	svc := New(Config{Backend: newFakeBackend(), Now: func() time.Time { return now }})
	defer svc.Close()
	info, err := svc.Create(context.Background(), CreateRequest{Owner: "o", Idle: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	svc.mu.Lock()
	b := svc.boxes[info.ID]
	svc.mu.Unlock()
	live := func() bool { _, err := svc.lookup("o", info.ID); return err == nil }

	now = now.Add(2 * time.Minute) // idle: the reaper would pick it
	done := svc.use(b)             // and a call begins before it acts
	svc.timedOut(b)
	if !live() {
		t.Fatal("closed during a call that began after the reaper looked")
	}
	done() // the idle clock restarts
	svc.timedOut(b)
	if !live() {
		t.Fatal("closed right after a call ended")
	}
	if _, err := svc.ExtendTimeout("o", info.ID, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	now = now.Add(5 * time.Minute)
	svc.timedOut(b)
	if !live() {
		t.Fatal("closed within a timeout extended after the reaper looked")
	}
	now = now.Add(6 * time.Minute)
	svc.timedOut(b)
	if live() {
		t.Fatal("still there, idle past its timeout")
	}
}

// envBackend records specs and makes sandboxes that answer an execution
// with the environment it was given.
type envBackend struct{ specs }

func (b *envBackend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	b.specs.Create(ctx, spec)
	return &envSandbox{}, nil
}

type envSandbox struct{ idleSandbox }

func (*envSandbox) Execute(_ context.Context, req sandbox.ExecRequest, _ sandbox.Sink) (*sandbox.Result, error) {
	return &sandbox.Result{Status: sandbox.StatusOK, Stdout: req.Env["E2B_SANDBOX_ID"]}, nil
}

// A sandbox whose id its environment holds (E2B's E2B_SANDBOX_ID) is asked
// of the backend without it, so that every such sandbox of one spec is
// alike and can come from a pool; its executions are given its own id.
func TestIDEnvLeavesTheSpecPoolable(t *testing.T) {
	rec := &envBackend{}
	svc := New(Config{Backend: rec})
	defer svc.Close()
	var ids []string
	for range 2 {
		info, err := svc.Create(context.Background(), CreateRequest{Owner: "k", Env: map[string]string{"E2B_SANDBOX": "true"},
			IDEnv: []string{"E2B_SANDBOX_ID"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
	}
	rec.mu.Lock()
	a, b := rec.got[0], rec.got[1]
	rec.mu.Unlock()
	if _, ok := a.Env["E2B_SANDBOX_ID"]; ok || a.Env["E2B_SANDBOX"] != "true" {
		t.Errorf("the backend's spec: %v", a.Env)
	}
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("two sandboxes of one request, two specs: %+v, %+v", a, b)
	}
	for _, id := range ids {
		res, err := svc.Execute(context.Background(), "k", id, sandbox.ExecRequest{Code: "1"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.Stdout != id {
			t.Errorf("sandbox %s's execution saw E2B_SANDBOX_ID=%q", id, res.Stdout)
		}
	}
}
