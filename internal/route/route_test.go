package route

import (
	"net/http"
	"testing"
)

func TestID(t *testing.T) {
	for path, want := range map[string]string{
		"/v1/sandboxes/{id}/files/{path...}": "id",
		"/volumecontent/{volumeID}/dir":      "volumeID",
		"/files/{path...}":                   "path",
		"/v1/sandboxes":                      "",
	} {
		if got := (Route{Path: path}).ID(); got != want {
			t.Errorf("%s: %q, want %q", path, got, want)
		}
	}
}

// A Mux serves what its routes declare and nothing else: a route served
// without a row, or a row not served, is a programming error found at
// once.
func TestMux(t *testing.T) {
	routes := []Route{{Method: "GET", Path: "/a/{id}", Forward: Sandbox}, {Path: "/b/", Forward: Pick}}
	h := func(http.ResponseWriter, *http.Request) {}
	panics := func(what string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: no panic", what)
			}
		}()
		f()
	}
	m := NewMux(routes)
	m.HandleFunc("GET /a/{id}", h)
	panics("an undeclared route", func() { m.HandleFunc("POST /a/{id}", h) })
	panics("a declared route not served", m.Complete)
	m.HandleFunc("/b/", h)
	m.Complete()
}
