package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	snapshotkey "github.com/vivarium-sandbox/vivarium/internal/snapshot"
)

// savingBackend is the fake backend whose sandboxes save an empty
// directory as their snapshot: what the adapter makes of the service's
// snapshots, without root.
type savingBackend struct{ fakeBackend }

func (b savingBackend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := b.fakeBackend.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &savingSandbox{sb.(*fakeSandbox)}, nil
}

type savingSandbox struct{ *fakeSandbox }

func (*savingSandbox) SnapshotSupported() error { return nil }

func (*savingSandbox) SaveSnapshot(_ context.Context, dir string) (int64, error) {
	return 0, os.Mkdir(dir, 0o700)
}

func newSnapshotServer(t *testing.T) *httptest.Server {
	t.Helper()
	svc := service.New(service.Config{Backend: savingBackend{fakeBackend{t.TempDir()}}, SnapshotDir: t.TempDir(),
		SnapshotKey: bytes.Repeat([]byte{1}, snapshotkey.KeySize)})
	t.Cleanup(func() { svc.Close() })
	ts := httptest.NewServer(New(Config{Service: svc, Auth: keys{"key-a": "a", "key-b": "b"}, Prefix: "/e2b"}))
	t.Cleanup(ts.Close)
	return ts
}

// Sandbox.listSnapshots({ name }) lists what that template id names, as
// E2B's API filters: a snapshot's id, every snapshot of a name, the
// newest for "name:latest", and nothing for a name no snapshot has.
func TestListSnapshotsByName(t *testing.T) {
	ts := newSnapshotServer(t)
	c := client{t, ts.URL}
	keyA := map[string]string{"X-API-Key": "key-a", "Content-Type": "application/json"}
	snap := func(key map[string]string, sb created, name string) string {
		t.Helper()
		resp, body := c.do("POST", "/e2b/sandboxes/"+sb.SandboxID+"/snapshots", strings.NewReader(`{"name":"`+name+`"}`), key)
		var info snapshotInfo
		if resp.StatusCode != http.StatusCreated || json.Unmarshal(body, &info) != nil {
			t.Fatalf("createSnapshot(%q): %d %s", name, resp.StatusCode, body)
		}
		return info.SnapshotID
	}
	list := func(query string) []string {
		t.Helper()
		resp, body := c.do("GET", "/e2b/snapshots?"+query, nil, keyA)
		var out []snapshotInfo
		if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &out) != nil {
			t.Fatalf("listSnapshots(%s): %d %s", query, resp.StatusCode, body)
		}
		ids := []string{}
		for _, x := range out {
			ids = append(ids, x.SnapshotID)
		}
		return ids
	}

	one, two := c.create("key-a", `{}`), c.create("key-a", `{}`)
	older := snap(keyA, one, "kept")
	newer := snap(keyA, two, "kept")
	other := snap(keyA, one, "other")
	unnamed := snap(keyA, one, "")
	// Another key's snapshot of the same name is never listed.
	snap(map[string]string{"X-API-Key": "key-b"}, c.create("key-b", `{}`), "kept")

	for _, tc := range []struct {
		query string
		want  []string
	}{
		{"", []string{unnamed, other, newer, older}},
		{"name=kept", []string{newer, older}},
		{"name=kept:latest", []string{newer}},
		{"name=" + older, []string{older}},
		{"name=" + unnamed, []string{unnamed}},
		{"name=kept&sandboxID=" + one.SandboxID, []string{older}},
		{"name=kept-does-not-exist", []string{}},
		{"name=kept:v1", []string{}},
		{"name=base", []string{}},
		{"name=Not+A+Name", []string{}},
	} {
		if got := list(tc.query); !slices.Equal(got, tc.want) {
			t.Errorf("listSnapshots(%s) = %v, want %v", tc.query, got, tc.want)
		}
	}
}
