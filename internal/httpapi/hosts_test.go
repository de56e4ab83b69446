package httpapi

import (
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
)

// On loopback, a request naming a foreign host (a page's rebound name) is
// refused; loopback names, allowed names and the server's domain pass.
// Elsewhere nothing is checked.
func TestCheckHost(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	srv := httptest.NewServer(CheckHost(ok, []string{"vivarium.internal"}, "preview.test:8080"))
	defer srv.Close()
	for host, want := range map[string]int{
		"localhost":                     204,
		"LOCALHOST:8080":                204,
		"127.0.0.1:9999":                204,
		"127.1.2.3":                     204,
		"[::1]:8080":                    204,
		"app.localhost":                 204,
		"vivarium.internal:80":          204,
		"preview.test":                  204,
		"8000-sb_abc.preview.test:443":  204,
		"api.preview.test":              204,
		"attacker.example":              403,
		"attacker.example:8080":         403,
		"localhost.attacker.example":    403,
		"preview.test.attacker.example": 403,
		"10.0.0.1":                      403,
	} {
		req, _ := http.NewRequest("GET", srv.URL+"/v1/sandboxes", nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %q: %d, want %d", host, resp.StatusCode, want)
		}
	}

	// A connection to another address is not checked.
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		ipn, isIP := a.(*net.IPNet)
		if !isIP || ipn.IP.IsLoopback() || ipn.IP.To4() == nil {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort(ipn.IP.String(), "0"))
		if err != nil {
			continue
		}
		other := httptest.NewUnstartedServer(CheckHost(ok, nil, ""))
		other.Listener.Close()
		other.Listener = l
		other.Start()
		defer other.Close()
		req, _ := http.NewRequest("GET", other.URL, nil)
		req.Host = "attacker.example"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 204 {
			t.Errorf("on %s: %d", ipn.IP, resp.StatusCode)
		}
		return
	}
	t.Log("no address but loopback to listen on: the other case is not tried")
}
