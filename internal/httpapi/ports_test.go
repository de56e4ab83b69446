package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/portproxy"
)

// portServer is a sandbox's HTTP server: /hello answers, /huge never ends,
// /hang never answers and ends when its client goes. One thread serves
// every connection: a thread each would hold the sandbox's pids (64) with
// TestPortsBounds' 64 hanging requests, and a request after them, or one
// of them, could then find no thread (seen under load: 502 for 30 s).
const portServer = `
import asyncio, sys
async def handle(r, w):
    try:
        head = (await r.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        path = head[0].split(" ")[1]
        host = next((h.split(":", 1)[1].strip() for h in head[1:] if h.lower().startswith("host:")), "")
        if path == "/hang":
            await r.read()
            return
        w.write(b"HTTP/1.0 200 OK\r\n\r\n")
        if path == "/huge":
            chunk = b"x" * (1 << 20)
            while True:
                w.write(chunk)
                await w.drain()
        w.write(b"hello from " + path.encode() + b" via " + host.encode())
        await w.drain()
    except Exception:
        pass
    finally:
        w.close()
async def main():
    srv = await asyncio.start_server(handle, "0.0.0.0", int(sys.argv[1]), backlog=256)
    await srv.serve_forever()
asyncio.run(main())
`

// startPortServer starts portServer on port in sandbox id and waits until
// it answers through the API.
func startPortServer(t *testing.T, c client, id string, port int) {
	t.Helper()
	c.json("PUT", "/v1/sandboxes/"+id+"/files/server.py", []byte(portServer), 201)
	c.json("POST", "/v1/sandboxes/"+id+"/processes", map[string]any{"cmd": fmt.Sprintf("python3 server.py %d", port)}, 201)
	tok := c.json("POST", fmt.Sprintf("/v1/sandboxes/%s/ports/%d", id, port), nil, 200)["token"].(string)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, _ := portGet(t, c.url, id, port, "/hello", tok)
		if code == 200 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox's server does not answer: %d", code)
		}
	}
}

func portGet(t *testing.T, base, id string, port int, path, tok string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d%s", base, id, port, path), nil)
	if tok != "" {
		req.Header.Set(portproxy.TokenHeader, tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The path form: a port token opens one port of one sandbox, and the dial
// is made in the sandbox's network, so that a port of the host or the
// server's own is a closed port of the sandbox.
func TestPortsPathForm(t *testing.T) {
	srv, _ := newServer(t)
	alice := client{t, srv.URL, "alice-key"}
	bob := client{t, srv.URL, "bob-key"}
	id := alice.json("POST", "/v1/sandboxes", nil, 201)["id"].(string)
	other := alice.json("POST", "/v1/sandboxes", nil, 201)["id"].(string)
	startPortServer(t, alice, id, 3000)

	access := alice.json("POST", "/v1/sandboxes/"+id+"/ports/3000", nil, 200)
	tok := access["token"].(string)
	if !strings.HasSuffix(access["path_url"].(string), "/v1/sandboxes/"+id+"/ports/3000/") || access["url"] != nil {
		t.Errorf("%v", access)
	}
	code, body := portGet(t, srv.URL, id, 3000, "/hello?x=1", tok)
	if code != 200 || !strings.HasPrefix(body, "hello from /hello?x=1 via 127.0.0.1:") {
		t.Fatalf("%d %q", code, body)
	}
	// The token in a link's query is taken out before the sandbox sees it.
	resp, err := http.Get(srv.URL + "/v1/sandboxes/" + id + "/ports/3000/hello?" + portproxy.TokenParam + "=" + url.QueryEscape(tok))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.Contains(string(b), tok) || !strings.HasPrefix(string(b), "hello from /hello via") {
		t.Errorf("%d %q", resp.StatusCode, b)
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Security-Policy"), "sandbox") {
		t.Errorf("CSP %q", resp.Header.Get("Content-Security-Policy"))
	}

	port3001 := alice.json("POST", "/v1/sandboxes/"+id+"/ports/3001", nil, 200)["token"].(string)
	otherTok := alice.json("POST", "/v1/sandboxes/"+other+"/ports/3000", nil, 200)["token"].(string)
	for name, c := range map[string]struct {
		id, tok string
		auth    string
	}{
		"no token":              {id, "", ""},
		"another port's token":  {id, port3001, ""},
		"another sandbox's":     {id, otherTok, ""},
		"a forged token":        {id, forged(tok), ""},
		"the API key":           {id, "", "Bearer alice-key"},
		"the API key as token":  {id, "alice-key", ""},
		"this token, elsewhere": {other, tok, ""},
	} {
		req, _ := http.NewRequest("GET", fmt.Sprintf("%s/v1/sandboxes/%s/ports/3000/hello", srv.URL, c.id), nil)
		if c.tok != "" {
			req.Header.Set(portproxy.TokenHeader, c.tok)
		}
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 401 || strings.Contains(string(b), "hello") {
			t.Errorf("%s: %d %s", name, resp.StatusCode, b)
		}
	}
	if code, _ := bob.do("POST", "/v1/sandboxes/"+id+"/ports/3000", nil); code != 404 {
		t.Errorf("bob made a token for alice's sandbox: %d", code)
	}
	for _, p := range []string{"0", "65536", "x", "03000", "+3000"} {
		if code, _ := alice.do("POST", "/v1/sandboxes/"+id+"/ports/"+p, nil); code != 400 {
			t.Errorf("port %s: %d", p, code)
		}
	}

	// A port of the host's loopback, and the server's own port, through
	// the sandbox: closed ports of the sandbox; nothing reaches the host.
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	var accepted sync.WaitGroup
	hits := 0
	accepted.Add(1)
	go func() {
		defer accepted.Done()
		for {
			c, err := host.Accept()
			if err != nil {
				return
			}
			hits++
			c.Close()
		}
	}()
	_, apiPort, _ := net.SplitHostPort(srv.Listener.Addr().String())
	_, hostPort, _ := net.SplitHostPort(host.Addr().String())
	for _, p := range []string{hostPort, apiPort} {
		pt := alice.json("POST", "/v1/sandboxes/"+id+"/ports/"+p, nil, 200)["token"].(string)
		req, _ := http.NewRequest("GET", fmt.Sprintf("%s/v1/sandboxes/%s/ports/%s/v1/sandboxes", srv.URL, id, p), nil)
		req.Header.Set(portproxy.TokenHeader, pt)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 502 || !strings.Contains(string(b), "port_closed") {
			t.Errorf("port %s of the host: %d %s", p, resp.StatusCode, b)
		}
	}
	host.Close()
	accepted.Wait()
	if hits != 0 {
		t.Errorf("the host's listener was reached %d times", hits)
	}
}

// A response that never ends is cut at the bound; a request that is
// never answered holds one connection and does not stop others; more
// connections than a sandbox may have at once are refused.
func TestPortsBounds(t *testing.T) {
	srv, _ := newServer(t)
	alice := client{t, srv.URL, "alice-key"}
	id := alice.json("POST", "/v1/sandboxes", nil, 201)["id"].(string)
	startPortServer(t, alice, id, 3000)
	tok := alice.json("POST", "/v1/sandboxes/"+id+"/ports/3000", nil, 200)["token"].(string)

	req, _ := http.NewRequest("GET", srv.URL+"/v1/sandboxes/"+id+"/ports/3000/huge", nil)
	req.Header.Set(portproxy.TokenHeader, tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil || n > portproxy.MaxResponseBody {
		t.Errorf("an endless response: %d bytes, %v", n, err)
	}

	// Requests that hang, up to the sandbox's bound of connections.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var hung sync.WaitGroup
	const hanging = 64 // service.MaxPortConns
	codes := make(chan int, hanging+1)
	for range hanging + 1 {
		hung.Add(1)
		go func() {
			defer hung.Done()
			req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/v1/sandboxes/"+id+"/ports/3000/hang", nil)
			req.Header.Set(portproxy.TokenHeader, tok)
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				codes <- resp.StatusCode
				resp.Body.Close()
			}
		}()
	}
	// One of them is refused (429) once the others hold every slot.
	select {
	case code := <-codes:
		if code != 429 {
			t.Errorf("one connection too many: %d", code)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("no request was refused")
	}
	if code, _ := portGet(t, srv.URL, id, 3000, "/hello", tok); code != 429 {
		t.Errorf("with every slot held: %d", code)
	}
	cancel()
	hung.Wait()
	// Slots come back as the hanging requests go.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, body := portGet(t, srv.URL, id, 3000, "/hello", tok)
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the hanging requests went: %d %s", code, body)
		}
	}
	var e struct{ Error struct{ Code string } }
	code, body := portGet(t, srv.URL, id, 3001, "/", alice.json("POST", "/v1/sandboxes/"+id+"/ports/3001", nil, 200)["token"].(string))
	if json.Unmarshal([]byte(body), &e); code != 502 || e.Error.Code != "port_closed" {
		t.Errorf("a closed port: %d %s", code, body)
	}
}

// forged is tok with one character of its MAC changed (the last two,
// set to "AA", left it unchanged once in about a thousand tokens).
func forged(tok string) string {
	b := []byte(tok)
	i := len(b) - 5
	b[i] = map[bool]byte{true: 'B', false: 'A'}[b[i] == 'A']
	return string(b)
}
