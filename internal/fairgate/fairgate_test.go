package fairgate

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"
)

// One address holds one slot however many requests it sends, a few wait
// and the rest are refused at once; another address gets a slot while
// it does; a slot given back goes to whoever waits.
func TestGate(t *testing.T) {
	g := New(2, 2, time.Minute)
	ctx := context.Background()
	leaveA, ok := g.Enter(ctx, "a")
	if !ok {
		t.Fatal("the first request")
	}
	waiting := make(chan bool)
	go func() { // a's second waits for a's turn
		leave, ok := g.Enter(ctx, "a")
		if ok {
			leave()
		}
		waiting <- ok
	}()
	// a's third: two of a's are in already.
	deadline := time.Now().Add(10 * time.Second)
	for {
		g.mu.Lock()
		n := g.addrs["a"].n
		g.mu.Unlock()
		if n == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if _, ok := g.Enter(ctx, "a"); ok {
		t.Fatal("a third request of one address entered")
	}
	// b is not kept waiting by a.
	leaveB, ok := g.Enter(ctx, "b")
	if !ok {
		t.Fatal("another address was kept out")
	}
	leaveB()
	leaveA()
	if !<-waiting {
		t.Fatal("a's waiting request did not get the turn given back")
	}
	g.mu.Lock()
	left := len(g.addrs)
	g.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d addresses left at the gate", left)
	}

	// No slot within the wait: refused.
	short := New(1, 4, 10*time.Millisecond)
	leave, _ := short.Enter(ctx, "a")
	if _, ok := short.Enter(ctx, "b"); ok {
		t.Fatal("entered a full gate")
	}
	leave()
	// A request whose client has gone does not wait.
	gone, cancel := context.WithCancel(ctx)
	cancel()
	full := New(1, 4, time.Minute)
	leave, _ = full.Enter(ctx, "a")
	if _, ok := full.Enter(gone, "b"); ok {
		t.Fatal("a request whose client went entered")
	}
	leave()
}

func TestClientAddr(t *testing.T) {
	for _, c := range []struct {
		remote    string
		xff       []string
		forwarded bool
		want      string
	}{
		{"192.0.2.7:5000", nil, false, "192.0.2.7"},
		{"[::ffff:192.0.2.7]:5000", nil, false, "192.0.2.7"},
		{"[2001:db8:1:2:3:4:5:6]:5000", nil, false, "2001:db8:1:2::/64"},
		{"[fe80::1%eth0]:5000", nil, false, "fe80::/64"},
		{"192.0.2.7:5000", []string{"198.51.100.1"}, false, "192.0.2.7"},
		{"10.0.0.1:5000", []string{"203.0.113.9, 198.51.100.1"}, true, "198.51.100.1"},
		{"10.0.0.1:5000", nil, true, "10.0.0.1"},
	} {
		r := httptest.NewRequest("GET", "/files", nil)
		r.RemoteAddr = c.remote
		for _, v := range c.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		if got := ClientAddr(r, c.forwarded); got != c.want {
			t.Errorf("%s %q (%v): %q, want %q", c.remote, c.xff, c.forwarded, got, c.want)
		}
	}
}
