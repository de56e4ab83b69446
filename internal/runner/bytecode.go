package runner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
)

// compileScript compiles every .py file of argv[1] into its __pycache__,
// each recorded as the file of the same name in argv[2] (the directory a
// sandbox sees), in the unchecked-hash form: loaded without a look at
// the source, which a sandbox's init writes anew at each start.
const compileScript = `
import importlib.util, os, py_compile, sys
src, shown = sys.argv[1], sys.argv[2]
for name in sorted(os.listdir(src)):
    if name.endswith(".py"):
        path = os.path.join(src, name)
        py_compile.compile(path, cfile=importlib.util.cache_from_source(path), dfile=shown + "/" + name,
                           doraise=True, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
`

// Bounds of what Bytecode reads back.
const (
	maxPyc      = 4 << 20
	maxBytecode = 16 << 20
)

// filesKey is the digest of the runner's files, made once.
var filesKey = sync.OnceValue(func() string {
	h := sha256.New()
	files := Files()
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		fmt.Fprintf(h, "%s\x00%d\x00", name, len(files[name]))
		h.Write(files[name])
	}
	return hex.EncodeToString(h.Sum(nil))
})

var (
	bytecodeMu   sync.Mutex
	bytecodeMemo = map[string]bytecodeResult{}
)

type bytecodeResult struct {
	files map[string][]byte
	err   error
}

// Bytecode is the runner's Python files (Files) compiled by python, an
// interpreter of the host's, as files of the runner's directory dir (where
// a sandbox sees them): "__pycache__/runner.cpython-311.pyc" and the
// like. A sandbox whose interpreter is of python's version loads them
// instead of compiling the runner at its start (start.py); another
// version looks for other names, and compiles the source.
//
// python runs outside any sandbox, as the caller, isolated from the
// environment and without site (-I -S), on nothing but the runner's own
// files. Its results are kept for the life of the process and, where
// cacheDir is not "", in cacheDir (a directory only root can write, on
// a path only root can change: fileutil.CheckRootOnly),
// under a name that changes with the runner's files and the
// interpreter's file: a host compiles them once.
func Bytecode(ctx context.Context, python, dir, cacheDir string) (map[string][]byte, error) {
	real, err := filepath.EvalSymlinks(python)
	if err != nil {
		return nil, fmt.Errorf("runner bytecode: %w", err)
	}
	st, err := os.Stat(real)
	if err != nil {
		return nil, fmt.Errorf("runner bytecode: %w", err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%d\x00%d\x00%s", filesKey(), real, st.Size(), st.ModTime().UnixNano(), dir)
	key := hex.EncodeToString(h.Sum(nil))[:16]

	bytecodeMu.Lock()
	defer bytecodeMu.Unlock()
	if r, ok := bytecodeMemo[key]; ok {
		return r.files, r.err
	}
	out, err := cachedBytecode(cacheDir, key)
	if err != nil || out == nil {
		if out, err = compileBytecode(ctx, real, dir, Files()); err == nil && cacheDir != "" {
			keepBytecode(cacheDir, key, out) // a cache that cannot be written is not needed
		}
	}
	bytecodeMemo[key] = bytecodeResult{out, err}
	return out, err
}

func compileBytecode(ctx context.Context, python, dir string, files map[string][]byte) (map[string][]byte, error) {
	tmp, err := os.MkdirTemp("", "vivarium-runner-")
	if err != nil {
		return nil, fmt.Errorf("runner bytecode: %w", err)
	}
	defer os.RemoveAll(tmp)
	for name, data := range files {
		if strings.HasSuffix(name, ".py") {
			if err := os.WriteFile(filepath.Join(tmp, name), data, 0o600); err != nil {
				return nil, fmt.Errorf("runner bytecode: %w", err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-I", "-S", "-c", compileScript, tmp, dir)
	cmd.Env = []string{}
	cmd.Dir = tmp
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("runner bytecode: %s: %w: %s", python, err, lastLines(b))
	}
	return readBytecode(filepath.Join(tmp, "__pycache__"))
}

// readBytecode reads the .pyc files of dir, as "__pycache__/NAME".
func readBytecode(dir string) (map[string][]byte, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("runner bytecode: %w", err)
	}
	out := map[string][]byte{}
	total := 0
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".pyc") {
			continue
		}
		b, err := readBounded(filepath.Join(dir, e.Name()), maxPyc)
		if err != nil {
			return nil, fmt.Errorf("runner bytecode: %w", err)
		}
		if total += len(b); total > maxBytecode {
			return nil, errors.New("runner bytecode: larger than expected")
		}
		out["__pycache__/"+e.Name()] = b
	}
	if len(out) == 0 {
		return nil, errors.New("runner bytecode: the interpreter compiled nothing")
	}
	return out, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() || st.Size() > limit {
		return nil, fmt.Errorf("%s: not a file of at most %d bytes", path, limit)
	}
	b := make([]byte, st.Size())
	_, err = f.ReadAt(b, 0)
	return b, err
}

// cachedBytecode reads cacheDir's bytecode of key: nil, nil if there is
// none, or none to be trusted.
func cachedBytecode(cacheDir, key string) (map[string][]byte, error) {
	dir := filepath.Join(cacheDir, "runner-"+key, "__pycache__")
	if cacheDir == "" || fileutil.CheckRootOnly(dir) != nil {
		return nil, nil
	}
	return readBytecode(dir)
}

// keepBytecode writes files to cacheDir as key's, whole or not at all.
func keepBytecode(cacheDir, key string, files map[string][]byte) error {
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return err
	}
	if err := fileutil.CheckRootOnly(cacheDir); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(cacheDir, ".runner-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(tmp, "__pycache__"), 0o755); err != nil {
		return err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(tmp, name), data, 0o444); err != nil {
			return err
		}
	}
	return os.Rename(tmp, filepath.Join(cacheDir, "runner-"+key))
}

// lastLines is the end of a command's output, for an error.
func lastLines(b []byte) string {
	s := strings.TrimSpace(string(b))
	return s[max(0, len(s)-400):]
}
