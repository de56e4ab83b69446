// Package rootview writes what a sandbox sees of the host, for every
// backend that builds a sandbox's root from the host's own files (native,
// gvisor, docker): the root's skeleton (a synthetic /etc, the runner's
// directory, the host's top-level directories as merged-/usr links or
// read-only binds, and mount points) and the synthesised files of its
// /proc, with the list of what /proc must hide.
//
// It only writes files and lists paths; mounting them is each backend's
// own. Nothing in it needs root.
package rootview

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// RunnerDir is where the runner's files are inside a sandbox.
const RunnerDir = "/opt/vivarium"

// Hostname is every sandbox's host name.
const Hostname = "sandbox"

// File is one file or link of a tree WriteFiles writes: the synthetic
// /etc, or the runner's directory.
type File struct {
	Path string `json:"path"` // relative to the tree's directory
	Data []byte `json:"data,omitempty"`
	Link string `json:"link,omitempty"` // symlink target, when set
}

// etcGenerated are written fresh for every sandbox: they describe the
// sandbox, not the host.
var etcGenerated = map[string]string{
	"passwd": "root:x:0:0:root:/root:/usr/sbin/nologin\n" +
		"sandbox:x:1000:1000:sandbox:/workspace:/bin/sh\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
	"group":         "root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n",
	"hostname":      Hostname + "\n",
	"hosts":         "127.0.0.1\tlocalhost " + Hostname + "\n::1\tlocalhost ip6-localhost ip6-loopback\n",
	"nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files\nnetworks: files\nprotocols: files\nservices: files\n",
	// No name server: there is no network to reach one.
	"resolv.conf": "",
	"timezone":    "Etc/UTC\n",
}

// GeneratedEtc is the content every sandbox's /etc/NAME has (hostname,
// hosts, resolv.conf ...), "" for a file it has none of.
func GeneratedEtc(name string) string { return etcGenerated[name] }

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

// HostEtc reads the synthetic /etc's content from the host's /etc
// (hostEtc): the files that describe the sandbox, and the public files of
// the host's that libraries need.
func HostEtc(hostEtc string) ([]File, error) {
	var out []File
	for name, data := range etcGenerated {
		out = append(out, File{Path: name, Data: []byte(data)})
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
			out = append(out, File{Path: rel, Link: target})
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
			out = append(out, File{Path: rel, Data: data})
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

// RunnerTree is what RunnerDir holds: the runner's files, and the shims
// (sandbox.ShimDir, inside RunnerDir).
func RunnerTree(files map[string][]byte) []File {
	out := make([]File, 0, len(files)+len(sandbox.Shims))
	for name, data := range files {
		out = append(out, File{Path: name, Data: data})
	}
	shims := strings.TrimPrefix(sandbox.ShimDir, RunnerDir+"/")
	for name, target := range sandbox.Shims {
		out = append(out, File{Path: shims + "/" + name, Link: target})
	}
	return out
}

// WriteFiles writes files (the synthetic /etc, or the runner's files)
// under dir. A path that would leave dir is refused.
func WriteFiles(dir string, files []File) error {
	for _, e := range files {
		p := filepath.Join(dir, filepath.Clean("/"+e.Path))
		if !strings.HasPrefix(p, dir+"/") {
			return fmt.Errorf("etc entry %q escapes", e.Path)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		var err error
		if e.Link != "" {
			err = os.Symlink(e.Link, p)
		} else {
			err = os.WriteFile(p, e.Data, 0o644)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// TopDir is a top-level directory of the root: a link into /usr on
// merged-/usr hosts, a read-only bind of the host directory otherwise.
type TopDir struct {
	Name string `json:"name"`
	Link string `json:"link,omitempty"`
}

// HostTopLevel lists the top-level directories of the host's root
// (hostRoot) a sandbox's root has: those of programs and libraries.
func HostTopLevel(hostRoot string) []TopDir {
	var out []TopDir
	for _, name := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"} {
		p := filepath.Join(hostRoot, name)
		info, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if info.Mode()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err == nil && strings.HasPrefix(filepath.Clean(filepath.Join("/", target)), "/usr/") {
				out = append(out, TopDir{Name: name, Link: target})
			}
			continue
		}
		if info.IsDir() {
			out = append(out, TopDir{Name: name})
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
	etc, err := HostEtc("/etc")
	if err != nil {
		return err
	}
	if err := WriteFiles(filepath.Join(dir, "etc"), etc); err != nil {
		return err
	}
	if err := WriteFiles(filepath.Join(dir, RunnerDir[1:]), RunnerTree(runnerFiles)); err != nil {
		return err
	}
	for _, t := range HostTopLevel("/") {
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
	for _, d := range []string{"usr", "workspace", "tmp", "proc", "dev", "home", "var", RunnerDir[1:] + "/bin"} {
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
	for _, t := range HostTopLevel("/") {
		if t.Link == "" {
			out = append(out, "/"+t.Name)
		}
	}
	return out
}
