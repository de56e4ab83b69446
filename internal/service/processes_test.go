package service

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

var (
	processBackendOnce sync.Once
	processBackend     *native.Backend
	processBackendErr  error
)

// newProcessService is a service on the native backend: processes are
// real programs in real sandboxes.
func newProcessService(t *testing.T) *Service {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	processBackendOnce.Do(func() {
		processBackend, processBackendErr = native.New(native.Config{CgroupParent: "vivarium-service-processes-test",
			UIDBase: native.DefaultUIDBase + 22<<24 + 8<<20, UIDRanges: testutil.UIDRanges})
	})
	if processBackendErr != nil {
		t.Fatal(processBackendErr)
	}
	svc := New(Config{Backend: processBackend})
	t.Cleanup(func() { svc.Close() })
	return svc
}

// startWaiting starts a process of owner's that runs until its input
// closes, in a new sandbox of owner's, with its first subscription closed.
func startWaiting(t *testing.T, svc *Service, owner string) *Process {
	t.Helper()
	info, err := svc.Create(context.Background(), CreateRequest{Owner: owner})
	if err != nil {
		t.Fatal(err)
	}
	p, sub, err := svc.StartProcess(context.Background(), owner, info.ID, ProcessRequest{Argv: []string{"/bin/cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	sub.Close()
	t.Cleanup(func() { p.CloseStdin() })
	return p
}

// follow subscribes n times, failing the test at the first refusal.
func follow(t *testing.T, p *Process, n int) []*Subscription {
	t.Helper()
	var subs []*Subscription
	for i := range n {
		sub, err := p.Subscribe()
		if err != nil {
			t.Fatalf("subscription %d of %d: %v", i+1, n, err)
		}
		subs = append(subs, sub)
	}
	return subs
}

func wantQuota(t *testing.T, what string, err error, says string) {
	t.Helper()
	if !errors.Is(err, ErrQuota) || !strings.Contains(err.Error(), says) {
		t.Fatalf("%s: %v, want ErrQuota saying %q", what, err, says)
	}
}

// A process has at most maxFollowersPerProcess streams of its output open,
// the one StartProcess makes included; closing one makes room.
func TestFollowersPerProcess(t *testing.T) {
	svc := newProcessService(t)
	info, err := svc.Create(context.Background(), CreateRequest{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	p, first, err := svc.StartProcess(context.Background(), "alice", info.ID, ProcessRequest{Argv: []string{"/bin/cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.CloseStdin()
	subs := follow(t, p, maxFollowersPerProcess-1)
	_, err = p.Subscribe()
	wantQuota(t, "one stream too many", err, "streams of its output open")
	first.Close()
	subs = append(subs, follow(t, p, 1)...)
	// Another process of the same key is unaffected.
	other := startWaiting(t, svc, "alice")
	subs = append(subs, follow(t, other, 1)...)
	// Every stream still gets the output.
	if err := p.WriteStdin(context.Background(), []byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	for i, sub := range subs[:maxFollowersPerProcess] {
		if ev := <-sub.Events(); string(ev.Stdout) != "hi\n" {
			t.Fatalf("stream %d: %+v", i, ev)
		}
	}
}

// An owner has at most its bound of streams open over all its processes,
// and another owner is unaffected by one at its bound; a stream's place is
// given back when it is closed or when its process ends.
func TestFollowersPerOwner(t *testing.T) {
	svc := newProcessService(t)
	svc.followers.mu.Lock()
	svc.followers.perOwner = 3
	svc.followers.mu.Unlock()
	a, b := startWaiting(t, svc, "alice"), startWaiting(t, svc, "alice")
	subs := append(follow(t, a, 2), follow(t, b, 1)...)
	_, err := b.Subscribe()
	wantQuota(t, "alice's fourth stream", err, "this key has 3 streams of process output open")
	bob := startWaiting(t, svc, "bob")
	follow(t, bob, 3)

	subs[0].Close()
	subs[0].Close() // twice gives back one place only
	follow(t, b, 1)
	_, err = a.Subscribe()
	wantQuota(t, "alice's fourth stream after one was replaced", err, "this key has 3 streams")

	// b ends: its two streams are given back though nobody closed them.
	b.CloseStdin()
	<-b.Done()
	follow(t, a, 2)
	svc.followers.mu.Lock()
	n := svc.followers.byOwner["alice"]
	svc.followers.mu.Unlock()
	if n != 3 {
		t.Fatalf("alice holds %d streams, want 3", n)
	}
}

// The server has at most its bound of streams open over all owners.
func TestFollowersOfTheServer(t *testing.T) {
	svc := newProcessService(t)
	svc.followers.mu.Lock()
	svc.followers.max = 2
	svc.followers.mu.Unlock()
	a := startWaiting(t, svc, "alice")
	subs := follow(t, a, 2)
	bob := startWaiting(t, svc, "bob")
	_, err := bob.Subscribe()
	wantQuota(t, "a stream over the server's bound", err, "the server has its maximum of 2 streams")
	subs[1].Close()
	follow(t, bob, 1)
}
