package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// req sends a request with headers hdr ("Host" sets the request's host)
// and a JSON body (nil: none), and returns the status and body.
func req(t testing.TB, method, u string, hdr map[string]string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, u, r)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if strings.HasPrefix(k, "Host") {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// e2bSandbox is one E2B sandbox of a key and its credentials.
type e2bSandbox struct {
	ID, Token, PortToken string
	// A volume of the key's, and its token ("": none, where the host
	// keeps no volumes).
	Volume, VolumeToken string
}

func newE2BSandbox(t *testing.T, srv *server, key string) e2bSandbox {
	t.Helper()
	code, b := req(t, "POST", srv.url+"/e2b/sandboxes", map[string]string{"X-API-Key": key}, map[string]any{"templateID": "base"})
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal(b, &sb); code != 201 || err != nil {
		t.Fatalf("create: %d %s", code, b)
	}
	code, b = req(t, "POST", srv.url+"/v1/sandboxes/"+sb.SandboxID+"/ports/8000", map[string]string{"Authorization": "Bearer " + key}, nil)
	var pa struct{ Token string }
	if err := json.Unmarshal(b, &pa); code != 200 || err != nil {
		t.Fatalf("port token: %d %s", code, b)
	}
	out := e2bSandbox{ID: sb.SandboxID, Token: sb.EnvdAccessToken, PortToken: pa.Token}
	code, b = req(t, "POST", srv.url+"/e2b/volumes", map[string]string{"X-API-Key": key}, map[string]string{"name": "v-" + sb.SandboxID[3:11]})
	var vol struct {
		VolumeID string `json:"volumeID"`
		Token    string `json:"token"`
	}
	switch err := json.Unmarshal(b, &vol); {
	case code == 201 && err == nil:
		out.Volume, out.VolumeToken = vol.VolumeID, vol.Token
	case code != 501:
		t.Fatalf("create a volume: %d %s", code, b)
	}
	return out
}

// reach tries each of a sandbox's tokens and says which open it: the E2B
// access token (envd's health), a signed file URL made with it, the
// volume token (a listing of the volume's files), the port
// token (the sandbox serves nothing on the port: a refusal of the token
// is 401 or 403, a sandbox that is gone 404, a port with nothing behind
// it 502).
func reach(t *testing.T, srv *server, sb e2bSandbox) map[string]bool {
	t.Helper()
	code, _ := req(t, "GET", srv.url+"/e2b/sandbox/health", map[string]string{"E2b-Sandbox-Id": sb.ID,
		"E2b-Sandbox-Port": "49983", "X-Access-Token": sb.Token}, nil)
	sum := sha256.Sum256([]byte("/home/user/nothing:read:user:" + sb.Token))
	q := url.Values{"path": {"/home/user/nothing"}, "username": {"user"},
		"signature": {"v1_" + base64.RawStdEncoding.EncodeToString(sum[:])}}
	signed, _ := req(t, "GET", srv.url+"/files?"+q.Encode(), nil, nil)
	port, _ := req(t, "GET", srv.url+"/v1/sandboxes/"+sb.ID+"/ports/8000/", map[string]string{"Vivarium-Port-Token": sb.PortToken}, nil)
	got := map[string]bool{"access": code == 204, "signed": signed == 404, "port": port != 401 && port != 403 && port != 404}
	if sb.Volume != "" {
		vol, _ := req(t, "GET", srv.url+"/e2b/volumecontent/"+sb.Volume+"/dir?path=/", map[string]string{"Authorization": "Bearer " + sb.VolumeToken}, nil)
		got["volume"] = vol == 200
	}
	return got
}

func all(m map[string]bool, want bool) bool {
	for _, v := range m {
		if v != want {
			return false
		}
	}
	return true
}

// A revoked key's every token stops working within seconds, another
// key's go on; its sandboxes run on until it is revoked with them; a
// rotated token opens nothing; a key's holder can revoke it through the
// API, closing its sandboxes.
func TestServeRevokedKeysTokens(t *testing.T) {
	needSandbox(t)
	dataDir := t.TempDir()
	alice, aliceID := createKey(t, dataDir, "alice")
	bob, bobID := createKey(t, dataDir, "bob")
	srv := startServer(t, dataDir, "--e2b-pausable=false", "--volume-size", "16MiB")
	a := newE2BSandbox(t, srv, alice)
	b := newE2BSandbox(t, srv, bob)
	if got := reach(t, srv, a); !all(got, true) {
		t.Fatalf("alice's tokens before any revocation: %v", got)
	}
	if a.Volume == "" {
		t.Log("this host keeps no volumes: volume tokens are not tried")
	}
	live := func() string {
		_, m := req(t, "GET", srv.url+"/metrics", map[string]string{"Authorization": "Bearer " + bob}, nil)
		for _, l := range strings.Split(string(m), "\n") {
			if v, ok := strings.CutPrefix(l, "vivarium_sandboxes_live "); ok {
				return v
			}
		}
		return "?"
	}

	// Rotated: the old access token (and its signed URLs) and the old
	// port token open nothing; the new ones do.
	code, body := req(t, "POST", srv.url+"/v1/sandboxes/"+a.ID+"/access-token", map[string]string{"Authorization": "Bearer " + alice}, nil)
	var rot struct{ Token string }
	if err := json.Unmarshal(body, &rot); code != 200 || err != nil || rot.Token == a.Token {
		t.Fatalf("rotate the access token: %d %s", code, body)
	}
	code, body = req(t, "POST", srv.url+"/v1/sandboxes/"+a.ID+"/ports/8000", map[string]string{"Authorization": "Bearer " + alice},
		map[string]bool{"rotate": true})
	var prot struct{ Token string }
	if err := json.Unmarshal(body, &prot); code != 200 || err != nil || prot.Token == a.PortToken {
		t.Fatalf("rotate the port token: %d %s", code, body)
	}
	if got := reach(t, srv, a); got["access"] || got["signed"] || got["port"] {
		t.Fatalf("rotated tokens still open: %v", got)
	}
	a.Token, a.PortToken = rot.Token, prot.Token
	if got := reach(t, srv, a); !all(got, true) {
		t.Fatalf("the new tokens: %v", got)
	}
	if code, _ := req(t, "POST", srv.url+"/v1/sandboxes/"+a.ID+"/access-token", map[string]string{"Authorization": "Bearer " + bob}, nil); code != 404 {
		t.Fatalf("bob rotated alice's token: %d", code)
	}

	// Revoked alone: every token refused within the keyring's seconds,
	// bob's go on, alice's sandbox lives on.
	if r := vivarium(t, "", "keys", "revoke", "--data-dir", dataDir, "alice"); r.code != 0 || !strings.Contains(r.stderr, "run on") {
		t.Fatalf("revoke: %+v", r)
	}
	testutil.WaitFor(t, 15*time.Second, "every token of the revoked key to be refused", func() bool {
		return all(reach(t, srv, a), false)
	})
	if got := reach(t, srv, b); !all(got, true) {
		t.Fatalf("bob's tokens after alice's key was revoked: %v", got)
	}
	if n := live(); n != "2" {
		t.Fatalf("%s sandboxes live after a key was revoked alone", n)
	}

	// Given its sandboxes (by id, already revoked): they are closed.
	if r := vivarium(t, "", "keys", "revoke", "--data-dir", dataDir, "--close-sandboxes", aliceID); r.code != 0 {
		t.Fatalf("revoke --close-sandboxes: %+v", r)
	}
	testutil.WaitFor(t, 15*time.Second, "the revoked key's sandbox to be closed", func() bool { return live() == "1" })
	if got := reach(t, srv, b); !all(got, true) {
		t.Fatalf("bob's tokens: %v", got)
	}

	// Bob revokes his own key through the API, with his sandboxes.
	code, body = req(t, "POST", srv.url+"/v1/key/revoke", map[string]string{"Authorization": "Bearer " + bob},
		map[string]bool{"close_sandboxes": true})
	if code != 200 || !strings.Contains(string(body), `"sandboxes_closed":1`) || !strings.Contains(string(body), bobID) {
		t.Fatalf("self-revoke: %d %s", code, body)
	}
	if code, _ := req(t, "GET", srv.url+"/v1/sandboxes", map[string]string{"Authorization": "Bearer " + bob}, nil); code != 401 {
		t.Fatalf("a key revoked by its holder: %d", code)
	}
	if got := reach(t, srv, b); got["access"] || got["signed"] || got["port"] {
		t.Fatalf("bob's tokens after he revoked his key: %v", got)
	}
	r := vivarium(t, "", "keys", "list", "--data-dir", dataDir)
	if strings.Count(r.stdout, "with its sandboxes") != 2 {
		t.Fatalf("keys list:\n%s", r.stdout)
	}
}
