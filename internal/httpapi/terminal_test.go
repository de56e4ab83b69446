package httpapi_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// A process in a terminal: its output comes as terminal events carrying
// the exact bytes, typed input goes to .../stdin, .../resize resizes it.
func TestTerminalProcess(t *testing.T) {
	srv, _ := newServer(t)
	c := client{t, srv.URL, "alice-key"}
	sb := "/v1/sandboxes/" + c.json("POST", "/v1/sandboxes", nil, 201)["id"].(string)

	p := c.json("POST", sb+"/processes", map[string]any{"cmd": "exec bash --norc --noprofile -i",
		"terminal": map[string]any{"rows": 24, "cols": 80}}, 201)
	pid := fmt.Sprint(p["pid"])
	// A failed test leaves no stream open for the server's Close to wait on.
	t.Cleanup(func() { c.do("POST", sb+"/processes/"+pid+"/signal", map[string]any{"signal": "SIGKILL"}) })
	if term, _ := p["terminal"].(map[string]any); term["rows"] != 24.0 || term["cols"] != 80.0 {
		t.Fatalf("started: %v", p)
	}
	var mu sync.Mutex
	var shown []byte
	var kinds []string
	ended := make(chan struct{})
	req, _ := http.NewRequest("GET", srv.URL+sb+"/processes/"+pid+"/output", nil)
	req.Header.Set("Authorization", "Bearer alice-key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(ended)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var ev struct {
				Type string `json:"type"`
				Data []byte `json:"data"`
			}
			json.Unmarshal(sc.Bytes(), &ev)
			mu.Lock()
			kinds = append(kinds, ev.Type)
			shown = append(shown, ev.Data...)
			mu.Unlock()
		}
	}()
	expect := func(want string) {
		t.Helper()
		waitUntil(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return bytes.Contains(shown, []byte(want))
		}, func() string {
			mu.Lock()
			defer mu.Unlock()
			return fmt.Sprintf("the terminal did not show %q; it showed %q", want, shown)
		})
	}
	c.json("POST", sb+"/processes/"+pid+"/stdin", []byte("stty size; printf '\\033[1m\\377m-%d\\n' $((6*7))\n"), 200)
	expect("24 80\r\n\x1b[1m\xffm-42\r\n") // bytes as they are, not UTF-8
	c.json("POST", sb+"/processes/"+pid+"/resize", map[string]any{"rows": 50, "cols": 132}, 200)
	c.json("POST", sb+"/processes/"+pid+"/stdin", []byte("stty size\n"), 200)
	expect("50 132\r\n")
	c.json("POST", sb+"/processes/"+pid+"/resize", map[string]any{"rows": 0, "cols": 132}, 400)
	c.json("POST", sb+"/processes/"+pid+"/stdin", []byte("exit 4\n"), 200)
	<-ended
	mu.Lock()
	if kinds[0] != "start" || kinds[len(kinds)-1] != "end" || strings.Contains(strings.Join(kinds, " "), "stdout") {
		t.Errorf("events: %v", kinds)
	}
	mu.Unlock()

	// A process without a terminal cannot be resized; a terminal must have
	// a size.
	plain := c.json("POST", sb+"/processes", map[string]any{"cmd": "sleep 30"}, 201)
	code, body := c.do("POST", sb+"/processes/"+fmt.Sprint(plain["pid"])+"/resize", map[string]any{"rows": 5, "cols": 5})
	if code != 400 || !strings.Contains(string(body), "no terminal") {
		t.Fatalf("resizing a process without a terminal: %d %s", code, body)
	}
	c.json("POST", sb+"/processes", map[string]any{"cmd": "true", "terminal": map[string]any{"rows": 5}}, 400)
	// Another key reaches none of it.
	client{t, srv.URL, "bob-key"}.json("POST", sb+"/processes/"+fmt.Sprint(plain["pid"])+"/resize", map[string]any{"rows": 5, "cols": 5}, 404)
}

func waitUntil(t *testing.T, cond func() bool, msg func() string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal(msg())
		}
	}
}

// A terminal is a session: its output is not capped at the sandbox's
// max_output, which caps a background process's.
func TestTerminalOutputIsNotCapped(t *testing.T) {
	srv, _ := newServer(t)
	c := client{t, srv.URL, "alice-key"}
	sb := "/v1/sandboxes/" + c.json("POST", "/v1/sandboxes", map[string]any{"limits": map[string]any{"max_output": 4096}}, 201)["id"].(string)
	// It waits for a line, sent once the output is followed.
	const cmd = "read go; head -c 100000 /dev/zero | tr '\\0' x; echo; echo end-$((1+1))"
	follow := func(body map[string]any) string {
		p := c.json("POST", sb+"/processes", body, 201)
		path := sb + "/processes/" + fmt.Sprint(p["pid"])
		req, _ := http.NewRequest("GET", srv.URL+path+"/output", nil)
		req.Header.Set("Authorization", "Bearer alice-key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var shown []byte
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var ev struct {
				Type string `json:"type"`
				Text string `json:"text"`
				Data []byte `json:"data"`
			}
			json.Unmarshal(sc.Bytes(), &ev)
			if ev.Type == "start" {
				c.json("POST", path+"/stdin", []byte("go\n"), 200)
			}
			shown = append(append(shown, ev.Text...), ev.Data...)
		}
		return string(shown)
	}
	if out := follow(map[string]any{"cmd": cmd, "terminal": map[string]any{"rows": 24, "cols": 80}}); !strings.Contains(out, "end-2\r\n") ||
		strings.Count(out, "x") != 100000 {
		t.Fatalf("terminal: %d bytes, %d x, ends %q", len(out), strings.Count(out, "x"), out[max(0, len(out)-40):])
	}
	if out := follow(map[string]any{"cmd": cmd, "stdin": true}); strings.Contains(out, "end-2") || !strings.Contains(out, "the rest is dropped") {
		t.Fatalf("without a terminal: %d bytes, ends %q", len(out), out[max(0, len(out)-80):])
	}
}
