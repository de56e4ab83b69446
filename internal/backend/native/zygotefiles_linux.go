package native

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/rootview"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/seccomp"
)

// A sandbox forked from a zygote sees some directories through read-only
// overlays of the zygote's own root (mount_linux.go): /etc's directories
// and the runner's files, which the zygote's init wrote there. A
// checkpoint of such a sandbox names those overlays' lower layers
// "zygote:/etc/ssl", "zygote:/opt/vivarium"; a restore overlays the same
// directories again from a copy on the host that the backend writes once
// (zygoteFiles), since the zygote may be gone by then.
const zygoteLowerPrefix = "zygote:"

// zygoteRunnerFiles are the files of a zygote's runner directory: the
// runner's, the sandbox's seccomp filter and the zygote's own.
func zygoteRunnerFiles() (map[string][]byte, error) {
	prog, err := sandboxFilter()
	if err != nil {
		return nil, err
	}
	zprog, err := seccomp.Compile(seccomp.ZygoteRules())
	if err != nil {
		return nil, err
	}
	files := runner.Files()
	files["seccomp.bpf"] = prog
	// The zygote's own filter, loaded before it imports anything: the
	// sandbox's, plus setns and what dropping privileges takes.
	files[zygoteFilter] = seccomp.Encode(zprog)
	return files, nil
}

// zygoteFiles returns the host directory holding what a zygote's root
// has of /etc and the runner (written once per backend under
// CheckpointDir, named by a digest of its contents), and, with write, makes
// sure it is there.
func (b *Backend) zygoteFiles(write bool) (string, error) {
	b.zfilesOnce.Do(func() { b.zfiles, b.zfilesLayers, b.zfilesErr = b.zygoteFilesDir() })
	if b.zfilesErr != nil || !write {
		return b.zfiles, b.zfilesErr
	}
	b.zfilesMu.Lock()
	defer b.zfilesMu.Unlock()
	if _, err := os.Stat(b.zfiles); err == nil {
		return b.zfiles, nil
	}
	return b.zfiles, writeZygoteFiles(b.zfiles, b.zfilesLayers)
}

// zygoteFilesDir computes zygoteFiles's path, and what it holds.
func (b *Backend) zygoteFilesDir() (string, map[string][]rootview.File, error) {
	etc, _, err := b.hostFiles()
	if err != nil {
		return "", nil, err
	}
	files, err := zygoteRunnerFiles()
	if err != nil {
		return "", nil, err
	}
	runnerName := strings.TrimPrefix(runnerDir, "/")
	layers := map[string][]rootview.File{"etc": etc, runnerName: rootview.RunnerTree(files)}
	h := sha256.New()
	for _, dir := range []string{"etc", runnerName} {
		entries := slices.Clone(layers[dir])
		slices.SortFunc(entries, func(a, b rootview.File) int { return strings.Compare(a.Path, b.Path) })
		for _, e := range entries {
			fmt.Fprintf(h, "%s/%s\x00%s\x00%d\x00", dir, e.Path, e.Link, len(e.Data))
			h.Write(e.Data)
		}
	}
	return filepath.Join(b.cfg.CheckpointDir, "zygote-files-"+hex.EncodeToString(h.Sum(nil))[:16]), layers, nil
}

// writeZygoteFiles writes layers to dir, whole or not at all.
func writeZygoteFiles(dir string, layers map[string][]rootview.File) error {
	root := filepath.Dir(dir)
	if err := os.MkdirAll(root, 0o711); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(root, ".zygote-files-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	for name, entries := range layers {
		if err := rootview.WriteFiles(filepath.Join(tmp, name), entries); err != nil {
			return fmt.Errorf("the zygote's files: %w", err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
		return err
	}
	return nil
}

// zygoteLower maps a forked sandbox's overlay lower layer, as its mount
// options name it in the zygote's root, to what a checkpoint records:
// "/.host/NAME" is the host's /NAME; a directory of the zygote's /etc,
// or its runner directory, is one of zygoteFiles. ok is false for any
// other path.
func zygoteLower(first string) (string, bool) {
	clean := filepath.Clean(first)
	if clean != first {
		return "", false
	}
	if name, found := strings.CutPrefix(first, "/"+hostDirs+"/"); found && name != "" && !strings.Contains(name, "/") {
		return "/" + name, true
	}
	if name, found := strings.CutPrefix(first, "/etc/"); found && name != "" && !strings.Contains(name, "/") && name != ".." {
		return zygoteLowerPrefix + first, true
	}
	if first == runnerDir {
		return zygoteLowerPrefix + first, true
	}
	return "", false
}

// resolveLower returns the host directory a checkpoint's lower layer
// names: a host directory as it is, a zygote's one beneath zygoteFiles
// (the backend's, given the checkpoint at dump or load time).
func resolveLower(lower, zygoteFiles string) (string, error) {
	rel, ok := strings.CutPrefix(lower, zygoteLowerPrefix)
	if !ok {
		return lower, nil
	}
	if _, ok := zygoteLower(rel); !ok || strings.HasPrefix(rel, "/"+hostDirs+"/") || zygoteFiles == "" {
		return "", fmt.Errorf("a lower layer %q", lower)
	}
	return filepath.Join(zygoteFiles, rel), nil
}
