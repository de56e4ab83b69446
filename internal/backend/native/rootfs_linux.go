package native

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// The sandbox's root file system, seen from inside:
//
//	/usr                  the host's /usr, read-only, nosuid, nodev
//	/bin /lib /lib64 ...  the host's merged-/usr links (or read-only binds)
//	/etc                  synthetic: only the files listed in etcPlan
//	/opt/vivarium         the runner
//	/proc                 a new proc of the sandbox's PID namespace, with masks
//	/dev                  null zero full random urandom tty, fd links, /dev/shm,
//	                      pts (devpts of its own) and ptmx
//	/                     the sandbox's disk: one size-limited tmpfs, whose
//	                      system directories (/etc, /root, /var ...) its
//	                      root owns; /workspace (also at /home/user), /tmp
//	                      and /dev/shm (from /run/shm) its user's
//
// /usr, the host's directories and the runner are read-only mounts.

// etcEntry is one file or link of the synthetic /etc.
type etcEntry struct {
	Path string `json:"path"` // relative to /etc
	Data []byte `json:"data,omitempty"`
	Link string `json:"link,omitempty"` // symlink target, when set
}

// SandboxUID and SandboxGID are the user code's ids inside the sandbox.
const (
	SandboxUID = 1000
	SandboxGID = 1000
	hostname   = "sandbox"
)

// etcGenerated are written fresh for every sandbox: they describe the
// sandbox, not the host.
var etcGenerated = map[string]string{
	"passwd": "root:x:0:0:root:/root:/usr/sbin/nologin\n" +
		"sandbox:x:1000:1000:sandbox:/workspace:/bin/sh\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
	"group":         "root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n",
	"hostname":      hostname + "\n",
	"hosts":         "127.0.0.1\tlocalhost " + hostname + "\n::1\tlocalhost ip6-localhost ip6-loopback\n",
	"nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files\nnetworks: files\nprotocols: files\nservices: files\n",
	// No name server: there is no network to reach one.
	"resolv.conf": "",
	"timezone":    "Etc/UTC\n",
}

// etcFromHost are copied from the host when present: public, non-secret
// files that libraries need. Directories are copied recursively (regular
// files and links only).
var etcFromHost = []string{
	"ld.so.cache",    // where the dynamic loader finds libraries
	"alternatives",   // numpy's BLAS and LAPACK are reached through these links
	"fonts",          // fontconfig, for matplotlib
	"matplotlibrc",   // Debian's default matplotlib settings
	"python3*",       // Debian's Python configuration and sitecustomize
	"mime.types",     // mimetypes
	"protocols",      // socket.getprotobyname
	"services",       // socket.getservbyname
	"os-release",     // platform.freedesktop_os_release (a link into /usr)
	"debian_version", //
	"localtime",      // a link into /usr/share/zoneinfo
	"ssl/openssl.cnf",
	"ssl/certs/ca-certificates.crt",
	"R",               // R's Renviron and ldpaths (/usr/lib/R/etc links here): R code contexts
	"java-*-openjdk*", // the JDK's jvm.cfg and security files, linked from /usr/lib/jvm: Java code contexts
}

// Bounds on what is copied, so a strange host cannot bloat every sandbox.
const (
	maxEtcFile  = 2 << 20
	maxEtcTotal = 8 << 20
)

// buildEtc reads the synthetic /etc's content from the host's /etc.
func buildEtc(hostEtc string) ([]etcEntry, error) {
	var out []etcEntry
	for name, data := range etcGenerated {
		out = append(out, etcEntry{Path: name, Data: []byte(data)})
	}
	total := 0
	add := func(rel string, d fs.DirEntry) error {
		p := filepath.Join(hostEtc, rel)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out = append(out, etcEntry{Path: rel, Link: target})
		case d.Type().IsRegular():
			info, err := d.Info()
			if err != nil {
				return err
			}
			if info.Size() > maxEtcFile || info.Mode().Perm()&0o004 == 0 {
				return nil // too big, or not world-readable: not for a sandbox
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if total += len(data); total > maxEtcTotal {
				return fmt.Errorf("host files for /etc exceed %d bytes", maxEtcTotal)
			}
			out = append(out, etcEntry{Path: rel, Data: data})
		}
		return nil
	}
	for _, pattern := range etcFromHost {
		roots, _ := filepath.Glob(filepath.Join(hostEtc, pattern))
		for _, root := range roots { // none when not on this host
			err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return err
				}
				rel, _ := filepath.Rel(hostEtc, p)
				return add(rel, d)
			})
			if err != nil {
				return nil, fmt.Errorf("read %s: %w", root, err)
			}
		}
	}
	return out, nil
}

// topLink is a top-level directory of the root: a link into /usr on
// merged-/usr hosts, a read-only bind of the host directory otherwise.
type topLink struct {
	Name string `json:"name"`
	Link string `json:"link,omitempty"`
}

func hostTopLevel(hostRoot string) []topLink {
	var out []topLink
	for _, name := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"} {
		p := filepath.Join(hostRoot, name)
		info, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if info.Mode()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err == nil && strings.HasPrefix(filepath.Clean(filepath.Join("/", target)), "/usr/") {
				out = append(out, topLink{Name: name, Link: target})
			}
			continue
		}
		if info.IsDir() {
			out = append(out, topLink{Name: name})
		}
	}
	return out
}

// RootSkeleton writes, under dir, what a sandbox's root holds apart from
// the host's /usr: the synthetic /etc, the merged-/usr links (or empty
// mount points for read-only binds of the host's directories, which
// TopLevelBinds lists), the runner, the links of /var/tmp, /root and
// /home/user, and empty mount points. Container backends build their root
// file system from it.
func RootSkeleton(dir string, runnerFiles map[string][]byte) error {
	etc, err := buildEtc("/etc")
	if err != nil {
		return err
	}
	if err := writeEtc(filepath.Join(dir, "etc"), etc); err != nil {
		return err
	}
	if err := writeEtc(filepath.Join(dir, runnerDir[1:]), runnerTree(runnerFiles)); err != nil {
		return err
	}
	for _, t := range hostTopLevel("/") {
		p := filepath.Join(dir, t.Name)
		if t.Link != "" {
			err = os.Symlink(t.Link, p)
		} else {
			err = os.MkdirAll(p, 0o755)
		}
		if err != nil {
			return err
		}
	}
	for _, d := range []string{"usr", "workspace", "tmp", "proc", "dev", "home", "var", runnerDir[1:] + "/bin"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	for _, l := range []struct{ name, target string }{{"var/tmp", "../tmp"}, {"root", "workspace"}, {"home/user", "/workspace"}} {
		if err := os.Symlink(l.target, filepath.Join(dir, l.name)); err != nil {
			return err
		}
	}
	return nil
}

// TopLevelBinds lists the host's top-level directories a root must bind
// read-only (on hosts without merged /usr).
func TopLevelBinds() []string {
	var out []string
	for _, t := range hostTopLevel("/") {
		if t.Link == "" {
			out = append(out, "/"+t.Name)
		}
	}
	return out
}

// runnerTree is what runnerDir holds: the runner's files, and the shims
// (sandbox.ShimDir, inside runnerDir).
func runnerTree(files map[string][]byte) []etcEntry {
	out := make([]etcEntry, 0, len(files)+len(sandbox.Shims))
	for name, data := range files {
		out = append(out, etcEntry{Path: name, Data: data})
	}
	shims := strings.TrimPrefix(sandbox.ShimDir, runnerDir+"/")
	for name, target := range sandbox.Shims {
		out = append(out, etcEntry{Path: shims + "/" + name, Link: target})
	}
	return out
}

// writeUsers writes the sandbox's /etc/passwd and /etc/group: root, the
// sandbox user (uid 1000) by the name and home its spec gives, and nobody.
func writeUsers(etc, name, home string) error {
	if name == "" {
		name, home = "sandbox", workspacePath
	}
	passwd := "root:x:0:0:root:/root:/bin/sh\n" +
		name + ":x:1000:1000:" + name + ":" + home + ":/bin/sh\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
	group := "root:x:0:\n" + name + ":x:1000:\nnogroup:x:65534:\n"
	for _, f := range []struct{ name, data string }{{"passwd", passwd}, {"group", group}} {
		p := filepath.Join(etc, f.name)
		os.Remove(p) // a link or a file of the zygote's copy
		if err := os.WriteFile(p, []byte(f.data), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// etcOfZygote makes a forked sandbox's /etc at dst from the zygote's, src:
// a directory of the sandbox's own, with copies of src's files and links,
// and read-only overlays of its directories (empty is the overlays' empty
// layer).
func etcOfZygote(src, dst, empty string) error {
	if err := os.Mkdir(dst, 0o755); err != nil && !os.IsExist(err) {
		return err
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		from, to := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		if e.IsDir() {
			if err := mountOverlay(from, empty, to); err != nil {
				return err
			}
			continue
		}
		if err := copyTree(from, to); err != nil {
			return err
		}
	}
	return nil
}

// copyTree copies src, a directory, file or link, to dst: directories,
// regular files and symbolic links, with their permission bits, owned by
// the caller. src is
// trusted (the zygote's /etc, which it wrote itself); other kinds of file
// are skipped.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(to, 0o755); err != nil && !os.IsExist(err) {
				return err
			}
			return os.Chmod(to, info.Mode().Perm())
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case d.Type().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(to, data, info.Mode().Perm())
		}
		return nil
	})
}
