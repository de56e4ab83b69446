package httpapi

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A client that stops sending its body mid-way fails its request once the
// body has been idle, while it keeps the connection open; a body that
// keeps coming, and a request whose body has ended, are not cut.
func TestIdleBodies(t *testing.T) {
	const idle = 200 * time.Millisecond
	got := make(chan error, 4)
	srv := httptest.NewServer(IdleBodies(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err == nil && r.URL.Path == "/long" {
			// The body has ended: what the handler does after is not
			// bounded by the body's deadline.
			time.Sleep(3 * idle)
			err = r.Context().Err()
		}
		got <- err
		fmt.Fprint(w, n)
	}), idle))
	defer srv.Close()

	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}

	// Stalled: half of the promised body, then nothing.
	c, _ := dial()
	fmt.Fprintf(c, "POST /stall HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n%s", strings.Repeat("a", 50))
	select {
	case err := <-got:
		if err == nil || !strings.Contains(err.Error(), "timeout") {
			t.Fatalf("a stalled body: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a stalled body was waited for without end")
	}

	// Slow but steady: each part within idle.
	c, br := dial()
	fmt.Fprintf(c, "POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n")
	for range 5 {
		time.Sleep(idle / 4)
		c.Write([]byte("a"))
	}
	if err := <-got; err != nil {
		t.Fatalf("a slow body: %v", err)
	}
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("a slow body's answer: %v %v", resp, err)
	}

	// Ended, and a handler that works on for longer than idle.
	c, br = dial()
	fmt.Fprintf(c, "POST /long HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
	if err := <-got; err != nil {
		t.Fatalf("after its body ended, the request was cut: %v", err)
	}
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the long request's answer: %v %v", resp, err)
	}
}

// A body the handler never reads, which its client never sends, does not
// hold the connection: the server's read of it after the handler ends
// within the idle time, and the connection is closed.
func TestIdleBodiesUnread(t *testing.T) {
	const idle = 200 * time.Millisecond
	srv := httptest.NewServer(IdleBodies(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
	}), idle))
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(time.Minute))
	rest, err := io.ReadAll(c) // the answer, then the end of the connection
	if err != nil || !strings.Contains(string(rest), "401") {
		t.Fatalf("the connection was held: %q %v", rest, err)
	}
}
