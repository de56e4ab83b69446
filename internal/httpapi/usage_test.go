package httpapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// A sandbox's metrics, read from a real sandbox: its cgroup's memory and
// CPU, its disk tmpfs.
func TestSandboxMetrics(t *testing.T) {
	srv, _ := newServer(t)
	as := func(key, method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := as("alice-key", "POST", "/v1/sandboxes", `{}`)
	var info service.Info
	if code != 201 || json.Unmarshal([]byte(body), &info) != nil {
		t.Fatalf("create: %d %s", code, body)
	}
	// 64 MiB held, 8 MiB on disk, and some CPU.
	code, body = as("alice-key", "POST", "/v1/sandboxes/"+info.ID+"/execute",
		`{"code":"x = bytearray(64 << 20)\nopen('/tmp/f', 'wb').write(b'x' * (8 << 20))\nsum(range(3_000_000))"}`)
	if code != 200 || !strings.Contains(body, `"status":"ok"`) {
		t.Fatalf("execute: %d %s", code, body)
	}
	code, body = as("alice-key", "GET", "/v1/sandboxes/"+info.ID+"/metrics", "")
	var got struct{ Samples []service.Sample }
	if code != 200 || json.Unmarshal([]byte(body), &got) != nil || len(got.Samples) == 0 {
		t.Fatalf("metrics: %d %s", code, body)
	}
	now := got.Samples[len(got.Samples)-1]
	if now.Memory < 64<<20 || now.Memory > now.MemoryMax || now.Disk < 8<<20 || now.Disk > now.DiskMax || now.CPUPercent <= 0 {
		t.Fatalf("sample: %+v", now)
	}
	if code, body := as("bob-key", "GET", "/v1/sandboxes/"+info.ID+"/metrics", ""); code != 404 {
		t.Fatalf("another key: %d %s", code, body)
	}
	if code, _ := as("alice-key", "GET", "/v1/sandboxes/"+info.ID+"/metrics?start=x", ""); code != 400 {
		t.Fatalf("bad start: %d", code)
	}
}
