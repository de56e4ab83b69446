// Package pkgindex is the package index sandboxes install from: a PEP 503
// "simple" index, served by the supervisor through each sandbox's proxy
// under the host name Host, that lists only the packages (and versions)
// the operator allows. Its files come from a local directory of wheels,
// or from an upstream index that the server itself reaches; either way a
// sandbox never talks to the upstream, and pip in the sandbox sees
// nothing the allowlist does not name (a dependency that is not on it is
// simply not found).
//
// Wheels only: a source distribution would run its build inside the
// sandbox with whatever it pulls in, and is not listed.
package pkgindex

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// Host is the name a sandbox's proxy serves the index under; pip in the
// sandbox uses http://Host/simple/.
const Host = "packages.vivarium.internal"

// IndexURL is what pip is given as --index-url.
const IndexURL = "http://" + Host + "/simple/"

var (
	// ErrNotAllowed: the package or version is not on the allowlist.
	ErrNotAllowed = errors.New("package not allowed")
	// ErrInvalid: a malformed package name, version or configuration.
	ErrInvalid = errors.New("invalid package")
)

// Allowed is one allowlist entry: a project, and the versions allowed
// (none listed: any).
type Allowed struct {
	Name     string // normalised (PEP 503)
	Versions []string
}

// ParseAllowed reads "NAME" or "NAME==VERSION".
func ParseAllowed(s string) (Allowed, error) {
	name, version, pinned := strings.Cut(strings.TrimSpace(s), "==")
	n, err := NormalizeName(name)
	if err != nil {
		return Allowed{}, err
	}
	a := Allowed{Name: n}
	if pinned {
		if err := ValidVersion(version); err != nil {
			return Allowed{}, err
		}
		a.Versions = []string{version}
	}
	return a, nil
}

var (
	nameRE    = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$`) })
	versionRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}$`) })
	runsRE    = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`[-_.]+`) })
)

// NormalizeName checks a project name and returns its PEP 503 form
// (lower case, runs of "-", "_" and "." as one "-").
func NormalizeName(s string) (string, error) {
	if len(s) > 100 || !nameRE().MatchString(s) {
		return "", fmt.Errorf("%w: %q is not a package name (letters, digits, '.', '_', '-')", ErrInvalid, clip(s))
	}
	return runsRE().ReplaceAllString(strings.ToLower(s), "-"), nil
}

// ValidVersion checks a version's characters (PEP 440's, loosely): it is
// matched as written, against the versions in wheel file names.
func ValidVersion(v string) error {
	if !versionRE().MatchString(v) {
		return fmt.Errorf("%w: %q is not a version", ErrInvalid, clip(v))
	}
	return nil
}

func clip(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

// Config configures an Index: the allowlist and one source.
type Config struct {
	Allowed []Allowed
	// Dir holds the wheels to serve.
	Dir string
	// Upstream is a simple index the server reaches itself
	// (https://pypi.org/simple/); its pages are read, filtered to the
	// allowlist, and its files relayed, through a client that refuses
	// to be sent to the host's loopback, private network or metadata
	// service (relay.go).
	Upstream string
	Logger   *slog.Logger
}

// Index serves the allowed packages.
type Index struct {
	cfg     Config
	allowed map[string][]string // name -> versions (nil: any)
	log     *slog.Logger
	client  *http.Client // to Upstream (relay.go)

	mu    sync.Mutex
	files map[string]fileEntry // by "name/filename", for upstream relays and hashes
	pages map[string]cachedPage
}

type fileEntry struct {
	name, version, filename string
	path                    string // local
	url                     string // upstream
	sha256                  string
	size                    int64
	mtime                   time.Time
}

type cachedPage struct {
	files []fileEntry
	at    time.Time
}

// New checks the configuration.
func New(cfg Config) (*Index, error) {
	if (cfg.Dir == "") == (cfg.Upstream == "") {
		return nil, fmt.Errorf("%w: give either a wheel directory or an upstream index URL", ErrInvalid)
	}
	if len(cfg.Allowed) == 0 {
		return nil, fmt.Errorf("%w: no package is allowed; list them (NAME or NAME==VERSION)", ErrInvalid)
	}
	if cfg.Dir != "" {
		if fi, err := os.Stat(cfg.Dir); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("%w: package directory %s: not a directory", ErrInvalid, cfg.Dir)
		}
	}
	var upstream *url.URL
	if cfg.Upstream != "" {
		u, err := url.Parse(cfg.Upstream)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%w: package index %q: want an http(s) URL", ErrInvalid, cfg.Upstream)
		}
		if !strings.HasSuffix(cfg.Upstream, "/") {
			cfg.Upstream += "/"
			u.Path += "/"
		}
		upstream = u
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ix := &Index{cfg: cfg, allowed: map[string][]string{}, log: cfg.Logger, files: map[string]fileEntry{},
		pages: map[string]cachedPage{}}
	if upstream != nil {
		ix.client = newRelay(upstream).client()
	}
	for _, a := range cfg.Allowed {
		if vs, seen := ix.allowed[a.Name]; seen && (vs == nil || a.Versions == nil) {
			ix.allowed[a.Name] = nil // any version
			continue
		}
		ix.allowed[a.Name] = append(ix.allowed[a.Name], a.Versions...)
	}
	return ix, nil
}

// Allows says whether a project (and version, if not empty) may be
// installed, in words for the client when not.
func (ix *Index) Allows(name, version string) error {
	n, err := NormalizeName(name)
	if err != nil {
		return err
	}
	if version != "" {
		if err := ValidVersion(version); err != nil {
			return err
		}
	}
	vs, ok := ix.allowed[n]
	if !ok {
		return fmt.Errorf("%w: %s is not on this server's package allowlist (it allows: %s)", ErrNotAllowed, n, ix.describe())
	}
	if version != "" && vs != nil && !slices.Contains(vs, version) {
		return fmt.Errorf("%w: %s %s is not allowed; allowed versions: %s", ErrNotAllowed, n, version, strings.Join(vs, ", "))
	}
	return nil
}

func (ix *Index) describe() string {
	var out []string
	for n, vs := range ix.allowed {
		if vs == nil {
			out = append(out, n)
		}
		for _, v := range vs {
			out = append(out, n+"=="+v)
		}
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// versionAllowed reports whether a file of project n at version v may be
// listed.
func (ix *Index) versionAllowed(n, v string) bool {
	vs, ok := ix.allowed[n]
	return ok && (vs == nil || slices.Contains(vs, v))
}

// ServeHTTP serves /simple/, /simple/NAME/ and /files/NAME/FILE.
func (ix *Index) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "GET only", http.StatusMethodNotAllowed)
		return
	}
	p := r.URL.Path
	switch {
	case p == "/simple/" || p == "/simple":
		ix.serveRoot(w)
	case strings.HasPrefix(p, "/simple/"):
		ix.serveProject(w, r, strings.Trim(strings.TrimPrefix(p, "/simple/"), "/"))
	case strings.HasPrefix(p, "/files/"):
		ix.serveFile(w, r, strings.TrimPrefix(p, "/files/"))
	default:
		http.NotFound(w, r)
	}
}

func (ix *Index) serveRoot(w http.ResponseWriter) {
	var names []string
	for n := range ix.allowed {
		names = append(names, n)
	}
	slices.Sort(names)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	fmt.Fprint(w, "<!DOCTYPE html>\n<html><body>\n")
	for _, n := range names {
		fmt.Fprintf(w, "<a href=\"/simple/%s/\">%s</a>\n", n, n)
	}
	fmt.Fprint(w, "</body></html>\n")
}

func (ix *Index) serveProject(w http.ResponseWriter, r *http.Request, raw string) {
	n, err := NormalizeName(raw)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	if n != raw {
		// pip asks for the normalised name; others are sent there.
		http.Redirect(w, r, "/simple/"+n+"/", http.StatusMovedPermanently)
		return
	}
	if _, ok := ix.allowed[n]; !ok {
		ix.log.Info("package index: not on the allowlist", "package", n)
		http.Error(w, fmt.Sprintf("%s is not on this server's package allowlist", n), http.StatusNotFound)
		return
	}
	files, err := ix.list(n)
	if err != nil {
		ix.log.Warn("package index", "package", n, "err", err)
		http.Error(w, "the package index could not list "+n, http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	fmt.Fprintf(w, "<!DOCTYPE html>\n<html><body>\n<h1>Links for %s</h1>\n", n)
	for _, f := range files {
		fmt.Fprintf(w, "<a href=\"/files/%s/%s#sha256=%s\">%s</a>\n", n, url.PathEscape(f.filename), f.sha256,
			html.EscapeString(f.filename))
	}
	fmt.Fprint(w, "</body></html>\n")
}

// list returns the allowed wheels of project n.
func (ix *Index) list(n string) ([]fileEntry, error) {
	var files []fileEntry
	var err error
	if ix.cfg.Dir != "" {
		files, err = ix.listDir(n)
	} else {
		files, err = ix.listUpstream(n)
	}
	if err != nil {
		return nil, err
	}
	ix.mu.Lock()
	for _, f := range files {
		ix.files[n+"/"+f.filename] = f
	}
	ix.mu.Unlock()
	return files, nil
}

// wheelInfo reads a wheel file name (PEP 427): project and version.
func wheelInfo(filename string) (name, version string, ok bool) {
	base, isWheel := strings.CutSuffix(filename, ".whl")
	parts := strings.Split(base, "-")
	if !isWheel || len(parts) < 5 || len(parts) > 6 {
		return "", "", false
	}
	n, err := NormalizeName(parts[0])
	if err != nil || ValidVersion(parts[1]) != nil {
		return "", "", false
	}
	return n, parts[1], true
}

func (ix *Index) listDir(n string) ([]fileEntry, error) {
	entries, err := os.ReadDir(ix.cfg.Dir)
	if err != nil {
		return nil, err
	}
	var out []fileEntry
	for _, e := range entries {
		name, version, ok := wheelInfo(e.Name())
		if !ok || name != n || !e.Type().IsRegular() || !ix.versionAllowed(n, version) {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		f := fileEntry{name: n, version: version, filename: e.Name(), path: filepath.Join(ix.cfg.Dir, e.Name()),
			size: fi.Size(), mtime: fi.ModTime()}
		if f.sha256, err = ix.hashOf(f); err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

// hashOf returns a local file's SHA-256, computed once per version of it.
func (ix *Index) hashOf(f fileEntry) (string, error) {
	ix.mu.Lock()
	old, ok := ix.files[f.name+"/"+f.filename]
	ix.mu.Unlock()
	if ok && old.sha256 != "" && old.size == f.size && old.mtime.Equal(f.mtime) {
		return old.sha256, nil
	}
	file, err := os.Open(f.path)
	if err != nil {
		return "", err
	}
	defer file.Close()
	h := sha256.New()
	if _, err := io.Copy(h, file); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// maxPage bounds an upstream project page; maxFile an upstream file.
const (
	maxPage  = 16 << 20
	maxFile  = 1 << 30
	pageTTL  = time.Minute
	shaRegex = `[0-9a-f]{64}`
)

var anchorRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?is)<a\s[^>]*href\s*=\s*["']([^"']+)["'][^>]*>`) })
var shaRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?:^|[#&])sha256=(` + shaRegex + `)`) })

func (ix *Index) listUpstream(n string) ([]fileEntry, error) {
	ix.mu.Lock()
	if c, ok := ix.pages[n]; ok && time.Since(c.at) < pageTTL {
		ix.mu.Unlock()
		return c.files, nil
	}
	ix.mu.Unlock()
	base, err := url.Parse(ix.cfg.Upstream + n + "/")
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequest(http.MethodGet, base.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/html")
	resp, err := ix.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, nil
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("upstream index: %s for %s", resp.Status, n)
	}
	page, err := io.ReadAll(io.LimitReader(resp.Body, maxPage))
	if err != nil {
		return nil, err
	}
	var out []fileEntry
	for _, m := range anchorRE().FindAllStringSubmatch(string(page), -1) {
		href := html.UnescapeString(m[1])
		u, err := base.Parse(href)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
			continue
		}
		filename := u.Path[strings.LastIndex(u.Path, "/")+1:]
		if unescaped, err := url.PathUnescape(filename); err == nil {
			filename = unescaped
		}
		name, version, ok := wheelInfo(filename)
		sha := shaRE().FindStringSubmatch(u.Fragment)
		if !ok || name != n || !ix.versionAllowed(n, version) || sha == nil {
			// Files without a hash are not offered: the server relays
			// bytes it cannot check, and pip checks them against this.
			continue
		}
		u.Fragment = ""
		out = append(out, fileEntry{name: n, version: version, filename: filename, url: u.String(), sha256: sha[1]})
	}
	ix.mu.Lock()
	ix.pages[n] = cachedPage{files: out, at: time.Now()}
	ix.mu.Unlock()
	return out, nil
}

func (ix *Index) serveFile(w http.ResponseWriter, r *http.Request, rest string) {
	raw, filename, ok := strings.Cut(rest, "/")
	n, err := NormalizeName(raw)
	if !ok || err != nil || n != raw || strings.ContainsAny(filename, "/\\") {
		http.NotFound(w, r)
		return
	}
	name, version, ok := wheelInfo(filename)
	if !ok || name != n || !ix.versionAllowed(n, version) {
		http.Error(w, "not an allowed package file", http.StatusNotFound)
		return
	}
	ix.mu.Lock()
	f, known := ix.files[n+"/"+filename]
	ix.mu.Unlock()
	if !known {
		// Listed since? (pip lists first; another client may not.)
		if _, err := ix.list(n); err == nil {
			ix.mu.Lock()
			f, known = ix.files[n+"/"+filename]
			ix.mu.Unlock()
		}
	}
	if !known {
		http.NotFound(w, r)
		return
	}
	if f.path != "" {
		file, err := os.Open(f.path)
		if err != nil {
			http.NotFound(w, r)
			return
		}
		defer file.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		http.ServeContent(w, r, filename, f.mtime, file)
		return
	}
	resp, err := ix.client.Get(f.url)
	if err != nil || resp.StatusCode != http.StatusOK {
		if resp != nil {
			ix.log.Warn("package index: upstream file", "url", f.url, "status", resp.Status)
			resp.Body.Close()
		} else {
			ix.log.Warn("package index: upstream file", "url", f.url, "err", err)
		}
		http.Error(w, "the upstream index did not deliver "+filename, http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	if resp.ContentLength > 0 {
		w.Header().Set("Content-Length", fmt.Sprint(resp.ContentLength))
	}
	io.Copy(w, io.LimitReader(resp.Body, maxFile))
}
