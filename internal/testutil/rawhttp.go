package testutil

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
)

// RawHTTP sends head (a request's line and headers, exactly as written;
// "Connection: close" and the blank line are added) to addr (host:port)
// and returns the answer's status, headers and body: for requests a
// client library would not send as they are.
func RawHTTP(t testing.TB, addr, head string) (int, http.Header, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, head+"Connection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q: %v", head, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}
