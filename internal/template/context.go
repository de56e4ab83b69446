package template

import (
	"archive/tar"
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
)

// Context is a build's files: a directory, less what its .dockerignore
// excludes. It is read through os.Root: a symbolic link is archived as a
// link, never followed out of the directory.
type Context struct {
	root    *os.Root
	ignore  []ignoreRule
	entries []contextEntry // what walk found, once for every COPY
	walked  bool
}

type ignoreRule struct {
	re        *regexp.Regexp
	exception bool // "!pattern": included again
}

// maxContextEntries bounds the files of a context.
const maxContextEntries = 1_000_000

// OpenContext opens the build's directory dir and reads its
// .dockerignore, if any.
func OpenContext(dir string) (*Context, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	c := &Context{root: root}
	f, err := root.Open(".dockerignore")
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		root.Close()
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		r := ignoreRule{}
		if strings.HasPrefix(line, "!") {
			r.exception, line = true, strings.TrimSpace(line[1:])
		}
		line = path.Clean(strings.TrimPrefix(line, "/"))
		if r.re, err = globRegexp(line); err != nil {
			root.Close()
			return nil, fmt.Errorf("%w: .dockerignore: %q: %v", ErrInvalid, line, err)
		}
		c.ignore = append(c.ignore, r)
	}
	return c, sc.Err()
}

// Close closes the context's directory.
func (c *Context) Close() error { return c.root.Close() }

// excluded says whether .dockerignore leaves out p (slash-separated,
// relative): the last rule that matches p or a directory above it says.
func (c *Context) excluded(p string) bool {
	out := false
	for _, r := range c.ignore {
		for q := p; ; q = path.Dir(q) {
			if r.re.MatchString(q) {
				out = !r.exception
				break
			}
			if q == "." || !strings.Contains(q, "/") {
				break
			}
		}
	}
	return out
}

// globRegexp turns a .dockerignore or COPY pattern into a regular
// expression: * and ? within one path element, ** across elements,
// [...] as a class.
func globRegexp(pattern string) (*regexp.Regexp, error) {
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(pattern); i++ {
		c := pattern[i]
		switch {
		case strings.HasPrefix(pattern[i:], "**/"):
			b.WriteString("(.*/)?")
			i += 2
		case strings.HasPrefix(pattern[i:], "**"):
			b.WriteString(".*")
			i++
		case c == '*':
			b.WriteString("[^/]*")
		case c == '?':
			b.WriteString("[^/]")
		case c == '[':
			end := strings.IndexByte(pattern[i:], ']')
			if end < 0 {
				return nil, errors.New("an unclosed [")
			}
			class := pattern[i+1 : i+end]
			if strings.HasPrefix(class, "!") {
				class = "^" + class[1:]
			}
			b.WriteString("[" + class + "]")
			i += end
		case c == '\\' && i+1 < len(pattern):
			i++
			b.WriteString(regexp.QuoteMeta(string(pattern[i])))
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	return regexp.Compile(b.String())
}

// Archive writes what a COPY of src (a path of the context or a
// pattern) takes as a tar to w, and returns the digest of that tar, the
// step's FilesHash. A file is archived under its name, a directory by
// what it holds (COPY copies a directory's content), in a fixed order,
// with owners and times left out, so that the digest changes only with
// names, modes, links and content. A source that matches nothing, or
// only what .dockerignore excludes, is an error.
func (c *Context) Archive(src string, w io.Writer) (string, error) {
	src, re, err := copyPattern(src)
	if err != nil {
		return "", err
	}
	all, err := c.walk()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(w, h))
	found := false
	for _, e := range all {
		name, ok := copyName(src, re, e.path, e.dir)
		if !ok {
			continue
		}
		found = true
		if err := c.add(tw, name, e); err != nil {
			return "", err
		}
	}
	if !found {
		return "", fmt.Errorf("%w: COPY %s: no such file in the build's files (or .dockerignore leaves it out)", ErrInvalid, src)
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// copyPattern is a COPY's source, cleaned, and its pattern.
func copyPattern(src string) (string, *regexp.Regexp, error) {
	src = path.Clean(strings.TrimPrefix(src, "/"))
	if src == ".." || strings.HasPrefix(src, "../") {
		return "", nil, fmt.Errorf("%w: %s is outside the build's files", ErrInvalid, src)
	}
	re, err := globRegexp(src)
	if err != nil {
		return "", nil, fmt.Errorf("%w: %s: %v", ErrInvalid, src, err)
	}
	return src, re, nil
}

// copyName is the name under which a COPY of src (re its pattern) takes
// the entry at p (slash-separated, relative to the build's files): the
// entry is the source itself, or inside a directory that is. A directory
// the source names comes as the entries below it, not as itself.
func copyName(src string, re *regexp.Regexp, p string, dir bool) (string, bool) {
	switch {
	case src == ".":
		return p, true
	case re.MatchString(p):
		return path.Base(p), !dir
	}
	top := p
	for top != "." && !re.MatchString(top) {
		top = path.Dir(top)
	}
	if top == "." {
		return "", false
	}
	return strings.TrimPrefix(p, top+"/"), true
}

type contextEntry struct {
	path string // slash-separated, relative
	dir  bool
	info fs.FileInfo
}

// walk lists the context's entries that .dockerignore keeps, sorted:
// read once, the first time a COPY asks.
func (c *Context) walk() ([]contextEntry, error) {
	if c.walked {
		return c.entries, nil
	}
	var out []contextEntry
	err := fs.WalkDir(c.root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == "." || c.excluded(p) {
			return nil
		}
		if len(out) >= maxContextEntries {
			return fmt.Errorf("%w: the build's files are more than %d", ErrInvalid, maxContextEntries)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out = append(out, contextEntry{path: p, dir: d.IsDir(), info: info})
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b contextEntry) int { return strings.Compare(a.path, b.path) })
	c.entries, c.walked = out, true
	return out, nil
}

// add writes one entry: a directory, a file, or a link as a link;
// anything else (a device, a socket, a FIFO) is an error.
func (c *Context) add(tw *tar.Writer, name string, e contextEntry) error {
	mode := int64(e.info.Mode().Perm())
	switch {
	case e.dir:
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode})
	case e.info.Mode()&fs.ModeSymlink != 0:
		target, err := c.root.Readlink(e.path)
		if err != nil {
			return err
		}
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777})
	case e.info.Mode().IsRegular():
		f, err := c.root.Open(e.path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: e.info.Size()}); err != nil {
			return err
		}
		_, err = io.CopyN(tw, f, e.info.Size())
		return err
	}
	return fmt.Errorf("%w: %s is not a file, a directory or a link", ErrInvalid, e.path)
}

// IsDir says whether src names a directory of the build's files (a COPY
// of it copies what it holds).
func (c *Context) IsDir(src string) (bool, error) {
	src = path.Clean(strings.TrimPrefix(src, "/"))
	if src == "." {
		return true, nil
	}
	all, err := c.walk()
	if err != nil {
		return false, err
	}
	for _, e := range all {
		if e.path == src {
			return e.dir, nil
		}
	}
	return false, nil
}
