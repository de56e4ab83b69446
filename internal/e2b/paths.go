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
)

// maxPathLen bounds paths; the workspace layer refuses longer ones too.
const maxPathLen = 4096

// toWorkspace maps a path of E2B's API onto the workspace: "." for the
// home itself, or a clean relative path without "..". Absolute paths must
// lie under /home/user or /workspace (the same directory); relative ones
// are relative to the home. Everything else is refused, with a message
// that says where files may go. Links are the workspace layer's business:
// it resolves every path without following any.
func toWorkspace(p string) (string, error) {
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
		abs = homeDir + "/" + p
	}
	abs = path.Clean(abs)
	for _, root := range []string{homeDir, workspaceDir} {
		if abs == root {
			return ".", nil
		}
		if rel, ok := strings.CutPrefix(abs, root+"/"); ok {
			return rel, nil
		}
	}
	return bad("is outside the sandbox's home: files live under " + homeDir + " (the workspace, also /workspace)")
}

// toSandbox is the absolute path, under the home, of a workspace path.
func toSandbox(rel string) string {
	if rel == "." || rel == "" {
		return homeDir
	}
	return homeDir + "/" + rel
}

// sandboxDir maps a working directory given to a command or a context: a
// relative one is relative to the home; an absolute one is taken as it is
// (any directory of the sandbox may be a working directory, /tmp
// included: the sandbox itself confines the process).
func sandboxDir(dir string) (string, error) {
	switch {
	case dir == "":
		return homeDir, nil
	case strings.ContainsRune(dir, 0) || len(dir) > maxPathLen:
		return "", fmt.Errorf("%w: invalid working directory %q", sandbox.ErrInvalidSpec, dir)
	case strings.HasPrefix(dir, "/"):
		return path.Clean(dir), nil
	}
	return path.Clean(homeDir + "/" + dir), nil
}
