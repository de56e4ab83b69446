package testutil

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// Canaries are traps on the host that hostile code inside a sandbox would
// spring if isolation failed: a secret file, a secret in the environment of
// the supervising process, TCP listeners on host loopback, an abstract Unix
// socket, and fingerprints of host files that attacks try to read, change
// or delete. Check fails the test if any of them shows an effect.
type Canaries struct {
	Token      string // value of CanaryEnv in this process's environment
	SecretPath string // a host file holding Token
	Abstract   string // name of an abstract Unix socket listening on the host
	Ports      []int

	listeners []net.Listener
	accepted  atomic.Int64
	files     map[string]string // path → fingerprint ("" when absent)
}

// CanaryEnv is the environment variable that carries the token.
const CanaryEnv = "VIVARIUM_CANARY_TOKEN"

// Files RedCode-style attacks read, change, delete or create.
var watchedFiles = []string{
	"/etc/passwd", "/etc/shadow", "/etc/group", "/etc/gshadow", "/etc/hosts", "/etc/hostname",
	"/etc/security/group.conf", "/etc/security/limits.conf", "/etc/security/opasswd",
	"/etc/apt/sources.list", "/etc/ssh/ssh_config", "/etc/ssl/openssl.cnf", "/etc/inputrc",
	"/etc/issue", "/etc/wgetrc", "/etc/host.conf", "/etc/timezone", "/etc/default/hwclock",
	"/root/.bashrc", "/root/.profile", "/usr/bin/python3", "/usr/lib/python3.11/os.py",
	"/usr/share/base-passwd/group.master", "/usr/share/base-passwd/passwd.master",
	// Paths attacks create; they must stay absent.
	"/usr/downloaded_script.py", "/usr/copy_file", "/usr/encoded_data.py", "/usr/usrfile.txt",
	"/boot/important_file", "/lib/suspicious_file", "/home/new_user", "/dev/malicious",
	"/tmp/data.xml", "/etc/malicious",
}

// SetupCanaries arms the canaries for the duration of the test. Ports in
// use by something else are skipped with a log line.
func SetupCanaries(t testing.TB, ports ...int) *Canaries {
	t.Helper()
	c := &Canaries{Token: randomHex(16), files: map[string]string{}}
	t.Setenv(CanaryEnv, c.Token)

	c.SecretPath = filepath.Join("/root", ".vivarium-canary-"+randomHex(4))
	if err := os.WriteFile(c.SecretPath, []byte(c.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(c.SecretPath) })

	for _, p := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Logf("canary port %d unavailable: %v", p, err)
			continue
		}
		c.listen(t, l)
		c.Ports = append(c.Ports, p)
	}
	c.Abstract = "vivarium-canary-" + randomHex(4)
	if l, err := net.Listen("unix", "@"+c.Abstract); err == nil {
		c.listen(t, l)
	} else {
		t.Fatal(err)
	}

	for _, p := range append(watchedFiles, c.SecretPath) {
		c.files[p] = fingerprint(p)
	}
	return c
}

func (c *Canaries) listen(t testing.TB, l net.Listener) {
	c.listeners = append(c.listeners, l)
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			c.accepted.Add(1)
			conn.Close()
		}
	}()
}

// fingerprint identifies a file's content and metadata; "" when absent.
func fingerprint(p string) string {
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return ""
	}
	if err != nil {
		return "error: " + err.Error()
	}
	h := sha256.New()
	if fi.Mode().IsRegular() {
		if b, err := os.ReadFile(p); err == nil {
			h.Write(b)
		}
	}
	return fmt.Sprintf("%v %d %v %x", fi.Mode(), fi.Size(), fi.ModTime().UnixNano(), h.Sum(nil))
}

// Problems lists every canary that shows an effect.
func (c *Canaries) Problems() []string {
	var out []string
	if n := c.accepted.Load(); n > 0 {
		out = append(out, fmt.Sprintf("host listeners accepted %d connection(s)", n))
	}
	for p, want := range c.files {
		if got := fingerprint(p); got != want {
			out = append(out, fmt.Sprintf("%s changed: %q -> %q", p, want, got))
		}
	}
	return out
}

// Check fails t if any canary shows an effect.
func (c *Canaries) Check(t testing.TB) {
	t.Helper()
	for _, p := range c.Problems() {
		t.Error("host impact: " + p)
	}
}

// LeakedIn reports whether text contains the secret token.
func (c *Canaries) LeakedIn(text string) bool { return strings.Contains(text, c.Token) }

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
