package e2b

import (
	"fmt"
	"path"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Where the workspace is, inside the sandbox, under E2B's name and
// Vivarium's.
const (
	homeDir      = "/home/user"
	workspaceDir = "/workspace"
	// rootHome is root's home: where its relative paths and commands
	// start, as in E2B's sandboxes.
	rootHome = "/root"
)

// homeOf is the home directory of user (checkUser's).
func homeOf(user string) string {
	if user == sandbox.UserRoot {
		return rootHome
	}
	return homeDir
}

// maxPathLen bounds paths; the workspace layer refuses longer ones too.
const maxPathLen = 4096

// toRoot maps a path of E2B's API onto the sandbox's file system, as a
// clean path relative to its "/" ("." for "/" itself), without "..": the
// home, /home/user, is the workspace, "workspace" (the same directory, and
// the name by which the whole file system reaches it); relative paths are
// relative to user's home (homeOf). Links are the file layer's business:
// it resolves every path without following any.
func toRoot(p, user string) (string, error) {
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("%w: %q %s", sandbox.ErrBadPath, p, why)
	}
	switch {
	case strings.ContainsRune(p, 0):
		return bad("contains a NUL byte")
	case len(p) > maxPathLen:
		return bad("is too long")
	}
	abs := p
	if !strings.HasPrefix(p, "/") {
		abs = homeOf(user) + "/" + p
	}
	abs = path.Clean(abs)
	for _, home := range []string{homeDir, workspaceDir} {
		if abs == home {
			return homeRel, nil
		}
		if rest, ok := strings.CutPrefix(abs, home+"/"); ok {
			return homeRel + "/" + rest, nil
		}
	}
	if abs == "/" {
		return ".", nil
	}
	return abs[1:], nil
}

// homeRel is the home directory as toRoot names it.
const homeRel = "workspace"

// isHome reports whether rel (toRoot's) is the home directory itself.
func isHome(rel string) bool { return rel == homeRel }

// toSandbox is the absolute path in the sandbox of a path toRoot made,
// the home by E2B's name for it.
func toSandbox(rel string) string {
	switch {
	case rel == "." || rel == "":
		return "/"
	case rel == homeRel:
		return homeDir
	case strings.HasPrefix(rel, homeRel+"/"):
		return homeDir + rel[len(homeRel):]
	}
	return "/" + rel
}

// sandboxDir maps a working directory given to a command or a context: a
// relative one (or none) is relative to user's home; an absolute one is
// taken as it is (any directory of the sandbox may be a working directory,
// /tmp included: the sandbox itself confines the process).
func sandboxDir(dir, user string) (string, error) {
	home := homeOf(user)
	switch {
	case dir == "":
		return home, nil
	case strings.ContainsRune(dir, 0) || len(dir) > maxPathLen:
		return "", fmt.Errorf("%w: invalid working directory %q", sandbox.ErrInvalidSpec, dir)
	case strings.HasPrefix(dir, "/"):
		return path.Clean(dir), nil
	}
	return path.Clean(home + "/" + dir), nil
}
