package main

import (
	"archive/tar"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// oneFileImage is an image of one layer holding file with body, owned by
// the test's user.
func oneFileImage(t *testing.T, file, body string) v1.Image {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: file, Mode: 0o644, Size: int64(len(body)), Uid: os.Getuid(), Gid: os.Getgid()})
	io.WriteString(tw, body)
	tw.Close()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestImageImportListRemove(t *testing.T) {
	data := t.TempDir()
	archive := filepath.Join(t.TempDir(), "app.tar")
	if err := tarball.WriteToFile(archive, name.MustParseReference("example.test/app:1"), oneFileImage(t, "app/main.py", "print(1)")); err != nil {
		t.Fatal(err)
	}
	r := vivarium(t, "", "image", "import", "--data-dir", data, archive)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "example.test/app:1 sha256:") || !strings.Contains(r.stderr, "layer 1/1") {
		t.Fatalf("image import: %+v", r)
	}
	r = vivarium(t, "", "image", "import", "--data-dir", data, "--tag", "other:2", archive)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "index.docker.io/library/other:2 ") {
		t.Fatalf("image import --tag: %+v", r)
	}
	r = vivarium(t, "", "image", "ls", "--data-dir", data)
	if r.code != 0 || !strings.Contains(r.stdout, "example.test/app:1") || !strings.Contains(r.stdout, "index.docker.io/library/other:2") {
		t.Errorf("image ls: %+v", r)
	}
	r = vivarium(t, "", "image", "rm", "--data-dir", data, "other:2", "absent:1")
	if r.code != 1 || !strings.Contains(r.stderr, "no such image: absent:1") {
		t.Errorf("image rm of one present and one absent image: %+v", r)
	}
	r = vivarium(t, "", "image", "ls", "--data-dir", data, "--json")
	var list []struct{ Name string }
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 1 || list[0].Name != "example.test/app:1" {
		t.Errorf("image ls --json after rm: %+v %v", r, err)
	}
	// An archive that is not one says so.
	bad := filepath.Join(t.TempDir(), "bad.tar")
	os.WriteFile(bad, []byte(strings.Repeat("not a tar ", 100)), 0o644)
	r = vivarium(t, "", "image", "import", "--data-dir", data, "--tag", "x:1", bad)
	if r.code != 1 || !strings.Contains(r.stderr, "image refused") {
		t.Errorf("image import of a bad archive: %+v", r)
	}
}

func TestImagePull(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a registry")
	}
	addr := testutil.Registry(t)
	ref, err := name.ParseReference(addr+"/tools:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, oneFileImage(t, "etc/tool.conf", "x")); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	r := vivarium(t, "", "image", "pull", "--data-dir", data, addr+"/tools:1")
	if r.code != 1 || !strings.Contains(r.stderr, "plain HTTP to it is refused") {
		t.Errorf("a pull over plain HTTP without --insecure-registry: %+v", r)
	}
	r = vivarium(t, "", "image", "pull", "--data-dir", data, "--insecure-registry", addr,
		"--registry-mirror", "registry.invalid="+addr, "registry.invalid/tools:1")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "registry.invalid/tools:1 sha256:") {
		t.Errorf("a pull through a mirror: %+v", r)
	}
	r = vivarium(t, "", "image", "pull", "--data-dir", data, "--username", "u", addr+"/tools:1")
	if r.code != 1 || !strings.Contains(r.stderr, "--password-stdin") {
		t.Errorf("--username without --password-stdin: %+v", r)
	}
}

// TestImagePullTLSAuth pulls from a registry that serves HTTPS with a
// CA of its own and asks for a password: the CA is trusted through
// SSL_CERT_FILE, the credentials come from standard input, and a wrong
// password or an untrusted CA fails saying so.
func TestImagePullTLSAuth(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a registry")
	}
	addr, ca := testutil.RegistryWith(t, testutil.RegistryOptions{TLS: true, User: "agent", Password: "s3cret"})
	pem, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	ref, err := name.ParseReference(addr + "/private/tools:2")
	if err != nil {
		t.Fatal(err)
	}
	err = remote.Write(ref, oneFileImage(t, "etc/private", "p"),
		remote.WithAuth(&authn.Basic{Username: "agent", Password: "s3cret"}),
		remote.WithTransport(&http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}))
	if err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	r := vivarium(t, "s3cret\n", "image", "pull", "--data-dir", data, "--username", "agent", "--password-stdin", addr+"/private/tools:2")
	if r.code != 1 || !strings.Contains(r.stderr, "certificate signed by unknown authority") {
		t.Errorf("a pull from a registry whose CA is not trusted: %+v", r)
	}
	t.Setenv("SSL_CERT_FILE", ca)
	r = vivarium(t, "wrong\n", "image", "pull", "--data-dir", data, "--username", "agent", "--password-stdin", addr+"/private/tools:2")
	if r.code != 1 || !strings.Contains(r.stderr, "UNAUTHORIZED") {
		t.Errorf("a pull with a wrong password: %+v", r)
	}
	r = vivarium(t, "s3cret\n", "image", "pull", "--data-dir", data, "--username", "agent", "--password-stdin", addr+"/private/tools:2")
	if r.code != 0 || !strings.HasPrefix(r.stdout, addr+"/private/tools:2 sha256:") {
		t.Errorf("a pull with the password: %+v", r)
	}
}
