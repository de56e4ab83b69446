package testutil

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// Registry starts Debian's docker-registry (the CNCF distribution) on a
// free port, over plain HTTP without auth, and returns its address.
func Registry(t testing.TB) string {
	t.Helper()
	addr, _ := RegistryWith(t, RegistryOptions{})
	return addr
}

// RegistryOptions say how a test registry is reached.
type RegistryOptions struct {
	// TLS serves HTTPS with a certificate of a CA made for the test.
	TLS bool
	// User and Password, when set, are asked for (basic auth, htpasswd).
	User, Password string
}

// RegistryWith starts a registry as o says and returns its address and,
// with TLS, the file of its CA's certificate (PEM). It skips the test
// where docker-registry is not installed.
func RegistryWith(t testing.TB, o RegistryOptions) (addr, caFile string) {
	t.Helper()
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		t.Skip("docker-registry is not installed (apt install docker-registry)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = l.Addr().String()
	l.Close()
	dir := t.TempDir()
	conf := fmt.Sprintf("version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n",
		filepath.Join(dir, "data"), addr)
	if o.TLS {
		caFile = filepath.Join(dir, "ca.crt")
		key := filepath.Join(dir, "registry.key")
		selfSigned(t, caFile, key)
		conf += fmt.Sprintf("  tls:\n    certificate: %s\n    key: %s\n", caFile, key)
	}
	if o.User != "" {
		// bcrypt, which the registry's htpasswd wants, from the C
		// library's crypt (libxcrypt) through Python; at its lowest
		// cost, which the registry pays on every request.
		out, err := exec.Command("python3", "-W", "ignore", "-c",
			"import crypt, sys; print(sys.argv[1] + ':' + crypt.crypt(sys.argv[2], crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)))",
			o.User, o.Password).Output()
		if err != nil {
			t.Fatalf("make the htpasswd file: %v", err)
		}
		pw := filepath.Join(dir, "htpasswd")
		os.WriteFile(pw, out, 0o600)
		conf += fmt.Sprintf("auth:\n  htpasswd:\n    realm: test\n    path: %s\n", pw)
	}
	confFile := filepath.Join(dir, "config.yml")
	os.WriteFile(confFile, []byte(conf), 0o600)
	cmd := exec.Command(bin, "serve", confFile)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return addr, caFile
		}
		if time.Now().After(deadline) {
			t.Fatalf("docker-registry did not listen on %s: %s", addr, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key.
func selfSigned(t testing.TB, certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "vivarium test registry"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
}
