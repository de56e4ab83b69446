package e2b

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// connect with a shorter timeout than the sandbox has leaves its end
// where it was; a longer one moves it later.
func TestConnectNeverShortens(t *testing.T) {
	ts, _ := newTestServer(t)
	c := client{t, ts.URL}
	auth := map[string]string{"X-API-Key": "key-a"}
	sb := c.create("key-a", `{"timeout":600}`)
	endAt := func() time.Time {
		t.Helper()
		resp, b := c.do("GET", "/e2b/sandboxes/"+sb.SandboxID, nil, auth)
		var d listedSandbox
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &d) != nil {
			t.Fatalf("get: %d %s", resp.StatusCode, b)
		}
		return d.EndAt
	}
	before := endAt()
	if resp, b := c.do("POST", "/e2b/sandboxes/"+sb.SandboxID+"/connect", strings.NewReader(`{"timeout":5}`), auth); resp.StatusCode != http.StatusOK {
		t.Fatalf("connect: %d %s", resp.StatusCode, b)
	}
	if after := endAt(); !after.Equal(before) {
		t.Fatalf("a connect with 5 s moved the end from %s to %s", before, after)
	}
	if resp, _ := c.do("POST", "/e2b/sandboxes/"+sb.SandboxID+"/connect", strings.NewReader(`{"timeout":3000}`), auth); resp.StatusCode != http.StatusOK {
		t.Fatal("connect")
	}
	if after := endAt(); !after.After(before) {
		t.Fatalf("a connect with 3000 s left the end at %s (was %s)", after, before)
	}
	if resp, _ := c.do("POST", "/e2b/sandboxes/"+sb.SandboxID+"/connect", strings.NewReader(`{"timeout":-1}`), auth); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("negative: %d", resp.StatusCode)
	}
}
