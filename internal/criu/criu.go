// Package criu finds and runs CRIU (checkpoint/restore in userspace), the
// program that saves a process tree to disk and brings it back, which the
// native backend uses to pause and resume sandboxes.
//
// The binary is built by scripts/criu/build.sh (make criu) from Debian
// trixie's CRIU 4.1.1: Debian 12's CRIU 3.17 fails `criu check` on current
// kernels. Find looks for it where that script puts it.
package criu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
)

// ErrNotFound: no usable criu binary on this machine.
var ErrNotFound = errors.New("criu not found: build it with `make criu` (scripts/criu/build.sh), or set VIVARIUM_CRIU to its path")

// MinMajor is the oldest CRIU release that works here: 3.x fails `criu
// check` on current kernels (the vDSO layout).
const MinMajor = 4

// Find returns the path of a criu binary of MinMajor or newer, looked for
// in order: $VIVARIUM_CRIU (the binary), $VIVARIUM_CRIU_DIR/criu, the
// newest ~/.cache/vivarium/criu-*/criu that scripts/criu/build.sh made,
// then criu on $PATH. A candidate that is there but too old is skipped,
// and named in the error when nothing fits.
func Find() (string, error) {
	var cands []string
	if p := os.Getenv("VIVARIUM_CRIU"); p != "" {
		cands = append(cands, p)
	}
	if d := os.Getenv("VIVARIUM_CRIU_DIR"); d != "" {
		cands = append(cands, filepath.Join(d, "criu"))
	}
	built, _ := fileutil.CachedBuilds("criu", "criu")
	cands = append(cands, built...)
	if p, err := exec.LookPath("criu"); err == nil {
		cands = append(cands, p)
	}
	var skipped []string
	for _, p := range cands {
		st, err := os.Stat(p)
		if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			continue
		}
		v, err := Version(p)
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("%s (%v)", p, err))
			continue
		}
		if major(v) < MinMajor {
			skipped = append(skipped, fmt.Sprintf("%s (version %s, need %d.x)", p, v, MinMajor))
			continue
		}
		return p, nil
	}
	if len(skipped) > 0 {
		return "", fmt.Errorf("%w; skipped: %s", ErrNotFound, strings.Join(skipped, ", "))
	}
	return "", ErrNotFound
}

var versionRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?m)^Version:\s*(\S+)`) })

// Version returns what `criu --version` says its version is ("4.1.1").
func Version(bin string) (string, error) {
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("criu --version: %w", err)
	}
	m := versionRe().FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("criu --version: no version in %q", strings.TrimSpace(string(out)))
	}
	return string(m[1]), nil
}

func major(v string) int {
	n, _ := strconv.Atoi(strings.SplitN(v, ".", 2)[0])
	return n
}

// Usable returns a criu binary (Find) that passes `criu check` on this
// kernel, or why there is none: a host where CRIU is there but cannot
// work is told so at once, by what `criu check` printed, rather than at
// each dump. A binary's check (a tenth of a second) is run once per
// process.
func Usable() (string, error) {
	bin, err := Find()
	if err != nil {
		return "", err
	}
	checkedMu.Lock()
	defer checkedMu.Unlock()
	err, ok := checked[bin]
	if !ok {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err = Check(ctx, bin)
		cancel()
		if err != nil {
			err = fmt.Errorf("%s cannot work on this host: %w", bin, err)
		}
		checked[bin] = err
	}
	if err != nil {
		return "", err
	}
	return bin, nil
}

var (
	checkedMu sync.Mutex
	checked   = map[string]error{} // by binary: its `criu check`
)

// Check runs `criu check`, which probes the kernel features that dump and
// restore need, and returns its last line ("Looks good."). An error
// carries what criu printed.
func Check(ctx context.Context, bin string) (string, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "check")
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	text := strings.TrimSpace(out.String())
	if err != nil {
		return "", fmt.Errorf("criu check: %w: %s", err, lastLines(text, 5))
	}
	return lastLines(text, 1), nil
}

// kdatDir returns the directory where criu keeps what it learnt of the
// kernel (its "kdat" cache, some 25 ms of probes at every dump and restore
// when it is not kept), or "" when there is none that is safe to use.
// criu keeps it only on a tmpfs, so that a reboot, maybe into another
// kernel, forgets it: criu's own place, /run, is not a tmpfs everywhere
// (it is not on this project's machines). The directory is
// /dev/shm/vivarium-criu-<uid>: made mode 0700 by this process, or
// found so, owned by its user and on a tmpfs; anything else there (made
// by another user of /dev/shm, a symlink) is not used, and criu then
// probes at every run. A criu without scripts/criu/kdat-dir.patch
// ignores the variable.
var kdatDir = sync.OnceValue(func() string {
	return privateTmpfsDir(fmt.Sprintf("/dev/shm/vivarium-criu-%d", os.Geteuid()))
})

// ProbeCache returns the directory where criu keeps its kernel probes for
// this process's runs, or "" where there is none safe to use (criu then
// probes the kernel at each run).
func ProbeCache() string { return kdatDir() }

// SpeedPatches are scripts/criu's patches that only make criu faster:
// a criu without them works, each dump and restore some 25 ms (kdat) and
// 5 ms (script actions) slower, and each restore on cgroup v1 10 to 20 ms
// more (its tasks moved into their group by pid).
var SpeedPatches = []string{"kdat-dir.patch", "script-actions.patch", "cgroup-move-self.patch"}

// MissingPatches lists those of patches (scripts/criu/*.patch) that the
// criu at bin was built without, as the BUILD-INFO that
// scripts/criu/build.sh writes beside it tells; none for a criu without
// one, built some other way, which is taken as it is.
func MissingPatches(bin string, patches []string) []string {
	info, err := os.ReadFile(filepath.Join(filepath.Dir(bin), "BUILD-INFO"))
	if err != nil {
		return nil
	}
	var missing []string
	for _, p := range patches {
		if !strings.Contains(string(info), "patched: "+p+"\n") {
			missing = append(missing, p)
		}
	}
	return missing
}

// privateTmpfsDir makes dir (mode 0700) and returns it, or returns "" when
// what is at dir is not a directory on a tmpfs, this user's, mode 0700.
func privateTmpfsDir(dir string) string {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return ""
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR ||
		st.Uid != uint32(os.Geteuid()) || st.Mode&0o777 != 0o700 {
		return ""
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		return ""
	}
	return dir
}

// MaxRun bounds one run of criu. A dump or restore that outlives it is
// stuck (a restored task that died where criu cannot see it leaves criu
// waiting for it forever): criu and its helpers are killed, and the run
// fails. A sandbox's dump or restore takes well under a second a hundred
// MiB.
var MaxRun = 3 * time.Minute

var errMaxRun = errors.New("criu ran past MaxRun")

// Run runs criu with args, the files in extra as its descriptors 3, 4,
// ... (for --inherit-fd), and its log written to logFile (a path relative
// to the images directory, as criu's -o takes it). An error carries the
// log's error lines.
//
// actions, when given, are the only steps at which criu runs an
// --action-script (a criu built with scripts/criu/script-actions.patch;
// another runs it at every step, and the script must do nothing at the
// others).
//
// criu runs in a process group of its own: when ctx ends, or MaxRun
// passes, the whole group is killed (criu's helpers too, which would
// otherwise outlive it holding its output). The tasks of a restore that
// was killed are the caller's to kill.
func Run(ctx context.Context, bin string, args []string, extra []*os.File, imagesDir, logFile string, actions ...string) error {
	ctx, cancel := context.WithTimeoutCause(ctx, MaxRun, errMaxRun)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.ExtraFiles = extra
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Env = os.Environ()
	if dir := kdatDir(); dir != "" {
		cmd.Env = append(cmd.Env, "CRIU_KDAT_DIR="+dir)
	}
	if len(actions) > 0 {
		cmd.Env = append(cmd.Env, "CRIU_SCRIPT_ACTIONS="+strings.Join(actions, ","))
	}
	if err := cmd.Run(); err != nil {
		if context.Cause(ctx) == errMaxRun {
			err = fmt.Errorf("%w: killed after %v", err, MaxRun)
		}
		return fmt.Errorf("criu %s: %w: %s%s", args[0], err, strings.TrimSpace(out.String()), logErrors(filepath.Join(imagesDir, logFile)))
	}
	return nil
}

// logErrors returns the Error lines of a criu log, for an error message.
func logErrors(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var errs []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "Error (") && !strings.Contains(l, "RLIMIT_NOFILE") {
			errs = append(errs, strings.TrimSpace(l))
		}
	}
	if len(errs) == 0 {
		return ""
	}
	if len(errs) > 8 {
		errs = errs[len(errs)-8:]
	}
	return "\n" + strings.Join(errs, "\n")
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
