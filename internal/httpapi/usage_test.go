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

// File metadata over Vivarium's API: set by X-Metadata-* on PUT, answered
// the same way on GET; what the sandbox sets that no header may carry is
// left out.
func TestFileMetadata(t *testing.T) {
	srv, _ := newServer(t)
	do := func(method, path string, body string, h map[string]string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer alice-key")
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := do("POST", "/v1/sandboxes", `{}`, map[string]string{"Content-Type": "application/json"})
	var info service.Info
	if resp.StatusCode != 201 || json.Unmarshal([]byte(body), &info) != nil {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}
	files := "/v1/sandboxes/" + info.ID + "/files/"
	resp, body = do("PUT", files+"m.txt", "x", map[string]string{"X-Metadata-Author": "mish"})
	if resp.StatusCode != 201 || !strings.Contains(body, `"metadata":{"author":"mish"}`) {
		t.Fatalf("put: %d %s", resp.StatusCode, body)
	}
	if resp, body := do("PUT", files+"big.txt", "x", map[string]string{"X-Metadata-K": strings.Repeat("v", 2000)}); resp.StatusCode != 400 {
		t.Fatalf("put over the bound: %d %s", resp.StatusCode, body)
	}
	// The sandbox adds a key no header may carry, and a value with a
	// line break.
	resp, body = do("POST", "/v1/sandboxes/"+info.ID+"/execute", `{"code":"import os\nos.setxattr('m.txt', 'user.e2b.a:b', b'x')\nos.setxattr('m.txt', 'user.e2b.evil', b'a\\r\\nSet-Cookie: x=y')\nos.setxattr('m.txt', 'user.e2b.tag', b'ok')"}`,
		map[string]string{"Content-Type": "application/json"})
	if resp.StatusCode != 200 || !strings.Contains(body, `"status":"ok"`) {
		t.Fatalf("execute: %d %s", resp.StatusCode, body)
	}
	resp, body = do("GET", files+"m.txt", "", nil)
	if resp.StatusCode != 200 || body != "x" || resp.Header.Get("X-Metadata-Author") != "mish" || resp.Header.Get("X-Metadata-Tag") != "ok" ||
		resp.Header.Get("Set-Cookie") != "" || resp.Header.Get("X-Metadata-Evil") != "" {
		t.Fatalf("get: %d %q %v", resp.StatusCode, body, resp.Header)
	}
}
