// Package kubetest starts a real Kubernetes API server for a test: etcd
// and kube-apiserver as processes of the test, on loopback, gone when the
// test ends.
//
// kube-apiserver is the one scripts/kube/build.sh builds from the Go
// module proxy and caches outside the checkout; etcd is Debian's. A test
// that calls Start skips when they are missing, naming the script, unless
// VIVARIUM_REQUIRE_KUBE=1 (as scripts/test.sh sets once it has built
// them), where it fails instead.
//
// What a cluster has: the API server alone, with token authentication
// (an admin in system:masters, plus the users the test names) and the
// Node and RBAC authorizers. No controller manager, scheduler or kubelet
// runs: objects are stored and served, but nothing acts on them (a
// deleted namespace stays Terminating, a Deployment makes no pods, no
// namespace gets a "default" ServiceAccount, so a Pod is refused by the
// ServiceAccount admission plugin unless its ServiceAccount exists).
package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// AdminUser is the name of the cluster's administrator, in the group
// system:masters (every permission, RBAC or not): Token(AdminUser) is
// AdminToken.
const AdminUser = "kubetest-admin"

// Issuer is the service-account token issuer, and the API audience.
const Issuer = "https://kubernetes.default.svc.cluster.local"

// How long the processes have to come up: etcd and kube-apiserver start in
// seconds, but the machine may be busy with other tests.
const (
	etcdTimeout  = 30 * time.Second
	readyTimeout = 120 * time.Second
)

// User is an identity the API server authenticates by a token of its own.
type User struct {
	Name   string
	Groups []string
}

// Options change how Start runs the API server. The zero value is what
// Start does.
type Options struct {
	// Address the API server binds and advertises (its self-signed
	// certificate names it). Default 127.0.0.1, which a pod cannot
	// reach: a test with a kubelet gives an address of the host that its
	// pods can (test/kube's TestSingleNodeCluster, its CNI bridge's).
	Address string
	// Flags added after the harness's own; a flag given twice takes the
	// last value.
	Flags []string
}

// Cluster is a running etcd and kube-apiserver.
type Cluster struct {
	URL        string // https://127.0.0.1:<port>
	CAFile     string // the API server's self-signed serving certificate (PEM), to verify it
	AdminToken string // bearer token of AdminUser

	t       testing.TB
	dir     string
	tokens  map[string]string
	client  *http.Client
	apiLog  string
	etcdLog string
}

// Start starts etcd and kube-apiserver, waits until /readyz says the API
// server is ready (its RBAC roles bootstrapped), and stops both and
// removes their files when the test ends. users are the identities
// besides AdminUser; they start with no permissions but those RBAC gives
// every authenticated user (discovery, self reviews).
func Start(t testing.TB, users ...User) *Cluster {
	t.Helper()
	return StartWith(t, Options{}, users...)
}

// StartWith is Start with options.
func StartWith(t testing.TB, opts Options, users ...User) *Cluster {
	t.Helper()
	testutil.SkipShort(t, "needs a kube-apiserver and etcd")
	addr := opts.Address
	if addr == "" {
		addr = "127.0.0.1"
	}
	apiserver, etcd, err := Find()
	if err != nil {
		if os.Getenv("VIVARIUM_REQUIRE_KUBE") == "1" {
			t.Fatalf("kubetest: %v (VIVARIUM_REQUIRE_KUBE=1)", err)
		}
		t.Skipf("kubetest: %v", err)
	}
	begin := time.Now()
	dir := t.TempDir()
	c := &Cluster{
		t:       t,
		dir:     dir,
		tokens:  map[string]string{},
		apiLog:  filepath.Join(dir, "kube-apiserver.log"),
		etcdLog: filepath.Join(dir, "etcd.log"),
	}
	if err := c.writeTokens(users); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	saKey, saPub, err := writeServiceAccountKey(dir)
	if err != nil {
		t.Fatalf("kubetest: service-account key: %v", err)
	}
	ports, err := freePorts(3)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	c.URL = "https://" + net.JoinHostPort(addr, strconv.Itoa(ports[2]))
	c.CAFile = filepath.Join(dir, "certs", "apiserver.crt")

	// Cleanups run last-registered first: the processes are killed
	// before t.TempDir's removal, which would otherwise fail on files
	// etcd still writes.
	etcdProc := c.spawn(etcd, c.etcdLog,
		"--name=kubetest",
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=kubetest="+peerURL,
		"--logger=zap",
		"--log-outputs=stderr",
	)
	if err := waitEtcd(etcdURL, etcdProc); err != nil {
		t.Fatalf("kubetest: etcd (%s): %v\n%s", etcd, err, tail(c.etcdLog, 30))
	}

	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + addr,
		"--advertise-address=" + addr,
		"--secure-port=" + strconv.Itoa(ports[2]),
		// Without --tls-cert-file the API server makes a self-signed
		// certificate for the advertise address, and writes it here.
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--token-auth-file=" + filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=Node,RBAC",
		// Required since 1.20: the issuer, the key that signs service
		// account tokens, and the key (here the same pair) that checks them.
		"--service-account-issuer=" + Issuer,
		"--service-account-signing-key-file=" + saKey,
		"--service-account-key-file=" + saPub,
		"--api-audiences=" + Issuer,
		"--service-cluster-ip-range=10.0.0.0/24",
		// The default ("lease") writes the API server's address into the
		// Endpoints of the "kubernetes" Service, which refuse a loopback
		// address: an error every 10 s. The Service exists without them.
		"--endpoint-reconciler-type=none",
		// A chart's node DaemonSet asks for privileges; let the API
		// server accept it (there is no kubelet to run it anyway).
		"--allow-privileged=true",
		"--profiling=false",
	}
	apiProc := c.spawn(apiserver, c.apiLog, append(args, opts.Flags...)...)
	if err := c.waitReady(apiProc); err != nil {
		t.Fatalf("kubetest: kube-apiserver (%s): %v\nlast lines of its log:\n%s", apiserver, err, tail(c.apiLog, 40))
	}
	t.Logf("kubetest: kube-apiserver at %s ready in %v (%s, %s)", c.URL, time.Since(begin).Round(time.Millisecond), apiserver, etcd)
	return c
}

// proc is a started etcd or kube-apiserver; exited is closed once it has
// ended and been reaped.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// spawn starts bin with its output in logPath, and registers its end:
// SIGKILL and reaping when the test ends, and the last lines of its log
// when the test failed.
func (c *Cluster) spawn(bin, logPath string, args ...string) *proc {
	c.t.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		c.t.Fatalf("kubetest: %v", err)
	}
	defer logf.Close() // the child has its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = c.dir
	detach(cmd)
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("kubetest: start %s: %v", bin, err)
	}
	p := &proc{cmd: cmd, exited: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(p.exited)
	}()
	c.t.Cleanup(func() {
		if c.t.Failed() {
			c.t.Logf("kubetest: last lines of %s:\n%s", filepath.Base(logPath), tail(logPath, 20))
		}
		cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// waitEtcd polls etcd's /health until it answers healthy.
func waitEtcd(url string, p *proc) error {
	deadline := time.Now().Add(etcdTimeout)
	client := &http.Client{Timeout: 2 * time.Second}
	last := "no answer"
	for time.Now().Before(deadline) {
		resp, err := client.Get(url + "/health")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && bytes.Contains(b, []byte(`"true"`)) {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(b))
		} else {
			last = err.Error()
		}
		select {
		case <-p.exited:
			return fmt.Errorf("exited: %v", p.cmd.ProcessState)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("not healthy after %v (last: %s)", etcdTimeout, last)
}

// waitReady polls the API server's /readyz, as the admin, through TLS
// verified against the certificate the API server wrote into its
// --cert-dir, which exists only once it has started.
func (c *Cluster) waitReady(p *proc) error {
	deadline := time.Now().Add(readyTimeout)
	last := "no certificate in --cert-dir yet"
	for time.Now().Before(deadline) {
		if c.client == nil {
			if client, err := httpClient(c.CAFile); err == nil {
				c.client = client
			}
		}
		if c.client != nil {
			code, body, err := c.do(c.AdminToken, http.MethodGet, "/readyz", nil)
			if err == nil && code == http.StatusOK {
				return nil
			}
			if err != nil {
				last = err.Error()
			} else {
				last = fmt.Sprintf("%d: %s", code, lastLines(string(body), 5))
			}
		}
		select {
		case <-p.exited:
			return fmt.Errorf("exited: %v", p.cmd.ProcessState)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("not ready after %v (last /readyz: %s)", readyTimeout, last)
}

// httpClient trusts only the certificates in caFile.
func httpClient(caFile string) (*http.Client, error) {
	pemBytes, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, fmt.Errorf("no certificate in %s", caFile)
	}
	return &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}, nil
}

// Token returns the bearer token of user (a name given to Start, or
// AdminUser).
func (c *Cluster) Token(user string) string {
	c.t.Helper()
	tok, ok := c.tokens[user]
	if !ok {
		c.t.Fatalf("kubetest: no user %q in this cluster", user)
	}
	return tok
}

// Kubeconfig writes a kubeconfig file for user (a name given to Start, or
// AdminUser) and returns its path: one cluster (the CA embedded), one
// user with its token, one context, current, in the namespace "default".
// client-go's clientcmd and kubectl read it.
func (c *Cluster) Kubeconfig(user string) string {
	c.t.Helper()
	tok := c.Token(user)
	ca, err := os.ReadFile(c.CAFile)
	if err != nil {
		c.t.Fatalf("kubetest: %v", err)
	}
	q := strconv.Quote // a Go-quoted string is a YAML double-quoted scalar
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Config\n")
	fmt.Fprintf(&b, "clusters:\n- name: kubetest\n  cluster:\n    server: %s\n    certificate-authority-data: %s\n",
		q(c.URL), base64.StdEncoding.EncodeToString(ca))
	fmt.Fprintf(&b, "users:\n- name: %s\n  user:\n    token: %s\n", q(user), q(tok))
	fmt.Fprintf(&b, "contexts:\n- name: %s\n  context:\n    cluster: kubetest\n    user: %s\n    namespace: default\n",
		q(user+"@kubetest"), q(user))
	fmt.Fprintf(&b, "current-context: %s\n", q(user+"@kubetest"))
	path := filepath.Join(c.dir, "kubeconfig-"+hex.EncodeToString([]byte(user)))
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		c.t.Fatalf("kubetest: %v", err)
	}
	return path
}

// Do sends one request to the API server with token as bearer (none when
// empty) and returns the status code and body. path is the URL's path
// and query ("/api/v1/namespaces"). body is sent as is when it is a
// []byte or a string, as JSON otherwise, nothing when nil. A request that
// gets no answer fails the test.
func (c *Cluster) Do(t testing.TB, token, method, path string, body any) (int, []byte) {
	t.Helper()
	var raw []byte
	switch b := body.(type) {
	case nil:
	case []byte:
		raw = b
	case string:
		raw = []byte(b)
	default:
		var err error
		if raw, err = json.Marshal(b); err != nil {
			t.Fatalf("kubetest: %s %s: %v", method, path, err)
		}
	}
	code, out, err := c.do(token, method, path, raw)
	if err != nil {
		t.Fatalf("kubetest: %s %s: %v", method, path, err)
	}
	return code, out
}

func (c *Cluster) do(token, method, path string, body []byte) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.URL+path, r)
	if err != nil {
		return 0, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

// writeTokens gives the admin and each user a random token, in the CSV
// file that --token-auth-file reads: token,user,uid,"group1,group2".
func (c *Cluster) writeTokens(users []User) error {
	all := append([]User{{Name: AdminUser, Groups: []string{"system:masters"}}}, users...)
	var b strings.Builder
	for _, u := range all {
		if u.Name == "" || strings.ContainsAny(u.Name, ",\"\r\n") {
			return fmt.Errorf("user name %q: empty, or has a comma, quote or newline", u.Name)
		}
		for _, g := range u.Groups {
			if g == "" || strings.ContainsAny(g, ",\"\r\n") {
				return fmt.Errorf("user %q: group %q: empty, or has a comma, quote or newline", u.Name, g)
			}
		}
		if _, dup := c.tokens[u.Name]; dup {
			return fmt.Errorf("user %q named twice", u.Name)
		}
		tok := rand.Text()
		c.tokens[u.Name] = tok
		fmt.Fprintf(&b, "%s,%s,%s,\"%s\"\n", tok, u.Name, u.Name, strings.Join(u.Groups, ","))
	}
	c.AdminToken = c.tokens[AdminUser]
	return os.WriteFile(filepath.Join(c.dir, "tokens.csv"), []byte(b.String()), 0o600)
}

// writeServiceAccountKey makes the RSA key pair that signs and checks
// service-account tokens, and returns the paths of its private and public
// halves (PEM).
func writeServiceAccountKey(dir string) (key, pub string, err error) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", "", err
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return "", "", err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		return "", "", err
	}
	key, pub = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
		return "", "", err
	}
	return key, pub, nil
}

// freePorts returns n distinct loopback ports free a moment ago. Another
// process may take one before etcd or the API server binds it; then
// that process fails to start, and says so in its log.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	return lastLines(string(b), n)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
