package httpapi_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// Streams of one process's output are bounded: one too many is 429 with a
// message that says so, and the place of a stream whose client has gone is
// given back.
func TestProcessOutputStreamsAreBounded(t *testing.T) {
	srv, _ := newServer(t)
	c := client{t, srv.URL, "alice-key"}
	sb := "/v1/sandboxes/" + c.json("POST", "/v1/sandboxes", nil, 201)["id"].(string)
	pid := fmt.Sprint(c.json("POST", sb+"/processes", map[string]any{"cmd": "cat", "stdin": true}, 201)["pid"])
	var streams []*http.Response
	// The server's Close waits for open streams: the process ends first.
	t.Cleanup(func() {
		c.do("POST", sb+"/processes/"+pid+"/signal", map[string]any{"signal": "SIGKILL"})
		for _, r := range streams {
			r.Body.Close()
		}
	})
	open := func() *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+sb+"/processes/"+pid+"/output", nil)
		req.Header.Set("Authorization", "Bearer alice-key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == http.StatusOK {
			// Followed once its start event is sent.
			if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.Contains(line, `"start"`) {
				t.Fatalf("first event: %q %v", line, err)
			}
			streams = append(streams, resp)
		}
		return resp
	}
	for i := range 16 {
		if resp := open(); resp.StatusCode != http.StatusOK {
			t.Fatalf("stream %d: %d", i+1, resp.StatusCode)
		}
	}
	resp := open()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a 17th stream: %d, want 429", resp.StatusCode)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"quota"`) ||
		!strings.Contains(string(body), "16 streams of its output open") {
		t.Fatalf("a 17th stream: %d %s", resp.StatusCode, body)
	}

	streams[0].Body.Close() // the client goes
	testutil.WaitFor(t, 10*time.Second, "the stream of a client gone to make room", func() bool {
		resp := open()
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return false
		}
		return true
	})
}
