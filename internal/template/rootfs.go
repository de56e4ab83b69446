package template

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// rootView reads the file system an image's layers make, as overlayfs
// stacks them, from the store's layer directories: for COPY's
// destination and owners, and WORKDIR's directory. Every layer is read
// through os.Root, one path element at a time; a link is never
// followed on the host: a link of the image is resolved as a path of
// the image (resolve), inside its root.
type rootView struct {
	layers []string // the layers' directories, the lowest first
}

// found is a path of the image, as the topmost layer that has it gives
// it.
type found struct {
	layer string
	fi    fs.FileInfo
}

func isWhiteout(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && fi.Mode()&fs.ModeCharDevice != 0 && st.Rdev == 0
}

// ownerOf is fi's owners.
func ownerOf(fi fs.FileInfo) (uid, gid int) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid), int(st.Gid)
	}
	return 0, 0
}

// lstat finds p (slash-separated, relative to the image's root, its
// parents not links) in the image; fs.ErrNotExist where no layer has it
// or one above hides it.
func (v *rootView) lstat(p string) (found, error) {
	p = path.Clean(p)
	if p == "." {
		return found{}, fmt.Errorf("the root: %w", fs.ErrInvalid)
	}
	parts := strings.Split(p, "/")
	for i := len(v.layers) - 1; i >= 0; i-- {
		f, stop, err := lstatIn(v.layers[i], parts)
		if err == nil || !errors.Is(err, fs.ErrNotExist) || stop {
			return f, err
		}
	}
	return found{}, fs.ErrNotExist
}

// lstatIn looks for parts in one layer. stop says that the layers below
// cannot have it: this one whites it out, or has a parent of it that is
// opaque or not a directory.
func lstatIn(layer string, parts []string) (f found, stop bool, err error) {
	root, err := os.OpenRoot(layer)
	if err != nil {
		return found{}, true, err
	}
	defer root.Close()
	opaque := false
	for j := range parts {
		q := strings.Join(parts[:j+1], "/")
		fi, err := root.Lstat(q)
		if errors.Is(err, fs.ErrNotExist) {
			return found{}, opaque, err
		}
		if err != nil {
			return found{}, true, err
		}
		if isWhiteout(fi) {
			return found{}, true, fs.ErrNotExist
		}
		if j == len(parts)-1 {
			return found{layer: layer, fi: fi}, true, nil
		}
		if !fi.IsDir() {
			return found{}, true, fs.ErrNotExist
		}
		if !opaque {
			if opaque, err = isOpaque(root, q); err != nil {
				return found{}, true, err
			}
		}
	}
	return found{}, true, fs.ErrNotExist
}

func isOpaque(root *os.Root, dir string) (bool, error) {
	d, err := root.Open(dir)
	if err != nil {
		return false, err
	}
	defer d.Close()
	v := make([]byte, 8)
	n, err := unix.Fgetxattr(int(d.Fd()), overlayOpaque, v)
	if errors.Is(err, unix.ENODATA) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return string(v[:n]) == "y", nil
}

// maxLinks bounds the links resolve follows, as the kernel's ELOOP.
const maxLinks = 40

// resolve is p (absolute or relative to the root) with every link of
// the image on its way resolved, inside the image's root: ".." stops
// at the root, an absolute link starts again from it. What does not
// exist is kept as it is. The result is relative to the root ("." for
// the root itself).
func (v *rootView) resolve(p string) (string, error) {
	var done []string
	rest := strings.Split(p, "/")
	links := 0
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(done) > 0 {
				done = done[:len(done)-1]
			}
			continue
		}
		cur := path.Join(append(done, c)...)
		f, err := v.lstat(cur)
		if errors.Is(err, fs.ErrNotExist) {
			done = append(done, c)
			continue
		}
		if err != nil {
			return "", err
		}
		if f.fi.Mode()&fs.ModeSymlink != 0 {
			if links++; links > maxLinks {
				return "", fmt.Errorf("%w: /%s: too many levels of links", ErrInvalid, p)
			}
			root, err := os.OpenRoot(f.layer)
			if err != nil {
				return "", err
			}
			target, err := root.Readlink(cur)
			root.Close()
			if err != nil {
				return "", err
			}
			if strings.HasPrefix(target, "/") {
				done = nil
			}
			rest = append(strings.Split(target, "/"), rest...)
			continue
		}
		done = append(done, c)
	}
	if len(done) == 0 {
		return ".", nil
	}
	return path.Join(done...), nil
}

// stat is p's entry, its links resolved.
func (v *rootView) stat(p string) (string, found, error) {
	r, err := v.resolve(p)
	if err != nil {
		return "", found{}, err
	}
	if r == "." {
		return r, found{}, nil // the root: a directory
	}
	f, err := v.lstat(r)
	return r, f, err
}

// isDir says whether p is a directory of the image (the root is).
func (v *rootView) isDir(p string) (bool, error) {
	r, f, err := v.stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return r == "." || f.fi.IsDir(), nil
}

// maxIDFile bounds the /etc/passwd and /etc/group read.
const maxIDFile = 4 << 20

// readFile reads a regular file of the image; "" if it has none.
func (v *rootView) readFile(p string) (string, error) {
	r, f, err := v.stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if r == "." || !f.fi.Mode().IsRegular() {
		return "", nil
	}
	root, err := os.OpenRoot(f.layer)
	if err != nil {
		return "", err
	}
	defer root.Close()
	// r has no link on its way in the image, nor in this layer.
	file, err := root.OpenFile(r, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return "", err
	}
	defer file.Close()
	b, err := io.ReadAll(io.LimitReader(file, maxIDFile))
	return string(b), err
}

// owner resolves a step's user ("name", "uid", "name:group",
// "uid:gid") through the image's /etc/passwd and /etc/group: "" is
// root. A user without a group takes its own id as its group's, as
// Docker's COPY --chown does.
func (v *rootView) owner(user string) (uid, gid int, err error) {
	if user == "" {
		return 0, 0, nil
	}
	u, g, hasGroup := strings.Cut(user, ":")
	if uid, err = v.lookupID("/etc/passwd", u); err != nil {
		return 0, 0, err
	}
	gid = uid
	if hasGroup {
		if gid, err = v.lookupID("/etc/group", g); err != nil {
			return 0, 0, err
		}
	}
	return uid, gid, nil
}

// runUser is who a RUN step runs as.
type runUser struct {
	uid, gid int
	groups   []int // supplementary
	home     string
	name     string // in the image's /etc/passwd; "": none
}

// ImageUser resolves an image's USER (not "") through the /etc/passwd and
// /etc/group of its layers (their directories, the lowest first), as a
// RUN step's user is: the sandbox user of the image's sandboxes. The
// answer is kept for the next sandbox (the lookup takes about 0.1 ms): a
// layer's directory in the store is named by its content's digest, and
// never changes.
func ImageUser(layers []string, user string) (sandbox.RootUser, error) {
	key := strings.Join(layers, "\n") + "\x00" + user
	imageUsers.Lock()
	u, ok := imageUsers.m[key]
	imageUsers.Unlock()
	if !ok {
		v := &rootView{layers: layers}
		r, err := v.runAs(user)
		if err != nil {
			return sandbox.RootUser{}, err
		}
		u = sandbox.RootUser{UID: uint32(r.uid), GID: uint32(r.gid), Name: r.name}
		for _, g := range r.groups {
			u.Groups = append(u.Groups, uint32(g))
		}
		imageUsers.Lock()
		if len(imageUsers.m) >= maxImageUsers {
			clear(imageUsers.m)
		}
		imageUsers.m[key] = u
		imageUsers.Unlock()
	}
	u.Groups = slices.Clone(u.Groups)
	return u, nil
}

// imageUsers are ImageUser's answers, by layers and USER.
var imageUsers = struct {
	sync.Mutex
	m map[string]sandbox.RootUser
}{m: map[string]sandbox.RootUser{}}

const maxImageUsers = 256

// maxGroups bounds a RUN step's supplementary groups.
const maxGroups = 64

// runAs resolves the user a RUN step runs as (USER's "name", "uid",
// "name:group" or "uid:gid"; "" is root) through the image's
// /etc/passwd and /etc/group, as Docker does: the user's id, its
// primary group unless one is given, its home, which is "/" for an id
// the image does not name (its group then 0), and, where no group is
// given, the supplementary groups /etc/group lists its name in. The
// sandbox user's names ("user", "sandbox") are uid 1000 where the image
// lacks them.
func (v *rootView) runAs(user string) (runUser, error) {
	if user == "" {
		return runUser{uid: 0, gid: 0, home: "/root"}, nil
	}
	u, g, hasGroup := strings.Cut(user, ":")
	n, numeric := strconv.Atoi(u)
	f, err := v.entry("/etc/passwd", func(f []string) bool { return len(f) >= 7 && (f[0] == u || numeric == nil && f[2] == u) })
	if err != nil {
		return runUser{}, err
	}
	r := runUser{uid: -1, home: "/"}
	if f != nil {
		id, err1 := strconv.Atoi(f[2])
		group, err2 := strconv.Atoi(f[3])
		if err1 != nil || err2 != nil {
			return runUser{}, fmt.Errorf("%w: the image's /etc/passwd gives %s the ids %q:%q", ErrInvalid, f[0], f[2], f[3])
		}
		r.uid, r.gid, r.home, r.name = id, group, f[5], f[0]
	}
	switch {
	case r.uid >= 0:
	case numeric == nil:
		r.uid = n
	case u == "user" || u == "sandbox":
		r.uid, r.gid, r.home = 1000, 1000, "/home/user"
	default:
		return runUser{}, &UserError{User: u} // as E2B's builds answer
	}
	if hasGroup {
		if r.gid, err = v.lookupID("/etc/group", g); err != nil {
			return runUser{}, err
		}
	} else if r.name != "" {
		if r.groups, err = v.groupsOf(r.name, r.gid); err != nil {
			return runUser{}, err
		}
	}
	if r.uid < 0 || r.uid >= sandboxIDs || r.gid < 0 || r.gid >= sandboxIDs {
		return runUser{}, fmt.Errorf("%w: user %s: a build's step runs as ids 0 to %d", ErrInvalid, user, sandboxIDs-1)
	}
	if r.home == "" {
		r.home = "/"
	}
	return r, nil
}

// groupsOf lists the groups of the image's /etc/group whose members
// include name, but primary: a user's supplementary groups. A group of
// an id a sandbox lacks is left out, as one the kernel could not give.
func (v *rootView) groupsOf(name string, primary int) ([]int, error) {
	text, err := v.readFile("/etc/group")
	if err != nil {
		return nil, err
	}
	var groups []int
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) < 4 || !slices.Contains(strings.Split(f[3], ","), name) {
			continue
		}
		id, err := strconv.Atoi(f[2])
		if err != nil || id < 0 || id >= sandboxIDs || id == primary || slices.Contains(groups, id) {
			continue
		}
		if len(groups) == maxGroups {
			return nil, fmt.Errorf("%w: user %s is in more than %d groups of the image", ErrInvalid, name, maxGroups)
		}
		groups = append(groups, id)
	}
	return groups, nil
}

// entry is the first line of the image's file (/etc/passwd or
// /etc/group), split at its colons, that match takes; nil if none does.
func (v *rootView) entry(file string, match func(fields []string) bool) ([]string, error) {
	text, err := v.readFile(file)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		if f := strings.Split(sc.Text(), ":"); match(f) {
			return f, nil
		}
	}
	return nil, nil
}

// lookupID is name's id in the image's file (/etc/passwd or
// /etc/group), or name itself if it is a number; an id a sandbox does
// not have (65,536 and up) is refused.
func (v *rootView) lookupID(file, name string) (int, error) {
	id, err := strconv.Atoi(name)
	if err != nil {
		f, err := v.entry(file, func(f []string) bool { return len(f) >= 3 && f[0] == name })
		if err != nil {
			return 0, err
		}
		if f == nil {
			return 0, fmt.Errorf("%w: %s: no such name in the image's %s", ErrInvalid, name, file)
		}
		if id, err = strconv.Atoi(f[2]); err != nil {
			return 0, fmt.Errorf("%w: the image's %s gives %s the id %q", ErrInvalid, file, name, f[2])
		}
	}
	if id < 0 || id >= sandboxIDs {
		return 0, fmt.Errorf("%w: id %d: a sandbox's ids are 0 to %d", ErrInvalid, id, sandboxIDs-1)
	}
	return id, nil
}
