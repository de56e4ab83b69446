package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestCheckDomain(t *testing.T) {
	for d, ok := range map[string]bool{
		"": true, "preview.example.com": true, "preview.example.com:8080": true, "localhost:8080": true,
		"vivarium.test": true,
		"127.0.0.1":     false, "127.0.0.1:8080": false, "[::1]:8080": false, "example": false, "*.example.com": false,
		".example.com": false, "example.com.": false, "exa mple.com": false, "http://example.com": false,
	} {
		if err := checkDomain(d); (err == nil) != ok {
			t.Errorf("checkDomain(%q): %v", d, err)
		}
	}
}

// E2B's own hosts under the domain reach the E2B API, never a sandbox's
// ports; every other host goes on to the ports.
func TestE2BHosts(t *testing.T) {
	var got *http.Request
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = r })
	ports := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = nil; w.WriteHeader(299) })
	h := &e2bHosts{domain: "preview.test:8080", hosts: ports, next: next}
	do := func(host, path string, hdr map[string]string) int {
		r := httptest.NewRequest("GET", "http://"+host+path, nil)
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		got = nil
		h.ServeHTTP(w, r)
		return w.Code
	}
	do("api.preview.test", "/v2/sandboxes", nil)
	if got == nil || got.URL.Path != "/e2b/v2/sandboxes" {
		t.Errorf("the control plane: %+v", got)
	}
	do("49983-sb_a.preview.test:8080", "/files", nil)
	if got == nil || got.URL.Path != "/e2b/sandbox/files" || got.Header.Get("E2b-Sandbox-Id") != "sb_a" ||
		got.Header.Get("E2b-Sandbox-Port") != "49983" {
		t.Errorf("envd: %+v", got)
	}
	do("49999-sb_a.preview.test", "/execute", map[string]string{"E2b-Sandbox-Id": "sb_a"})
	if got == nil || got.URL.Path != "/e2b/sandbox/execute" || got.Header.Get("E2b-Sandbox-Port") != "49999" {
		t.Errorf("the code interpreter: %+v", got)
	}
	if code := do("49983-sb_a.preview.test", "/files", map[string]string{"E2b-Sandbox-Id": "sb_b"}); code != 400 || got != nil {
		t.Errorf("another sandbox's id in the header: %d", code)
	}
	for _, host := range []string{"8000-sb_a.preview.test", "api.other.test", "x.api.preview.test"} {
		if code := do(host, "/", nil); code != 299 {
			t.Errorf("%s did not go to the ports: %d", host, code)
		}
	}
}
