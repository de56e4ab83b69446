package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// fake writes an executable script that stands in for criu.
func fake(t *testing.T, dir, body string) string {
	t.Helper()
	p := filepath.Join(dir, "criu")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// isolate leaves Find only the candidates a test makes.
func isolate(t *testing.T) string {
	dir := t.TempDir()
	t.Setenv("VIVARIUM_CRIU", "")
	t.Setenv("VIVARIUM_CRIU_DIR", "")
	t.Setenv("XDG_CACHE_HOME", filepath.Join(dir, "cache"))
	t.Setenv("PATH", filepath.Join(dir, "bin"))
	return dir
}

func TestFindOrder(t *testing.T) {
	dir := isolate(t)
	if _, err := Find(); !errors.Is(err, ErrNotFound) {
		t.Fatalf("nothing there: %v", err)
	}
	// On $PATH, but too old: skipped, and named.
	fake(t, filepath.Join(dir, "bin"), "echo 'Version: 3.17.1'")
	if _, err := Find(); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "version 3.17.1, need 4.x") {
		t.Fatalf("only 3.17: %v", err)
	}
	// What scripts/criu/build.sh leaves in the cache comes before $PATH.
	cached := fake(t, filepath.Join(dir, "cache", "vivarium", "criu-0123456789ab"), "echo 'Version: 4.1.1'")
	if got, err := Find(); err != nil || got != cached {
		t.Fatalf("cached: %q %v", got, err)
	}
	// $VIVARIUM_CRIU_DIR, then $VIVARIUM_CRIU, come first.
	inDir := fake(t, filepath.Join(dir, "built"), "echo 'Version: 4.2'")
	t.Setenv("VIVARIUM_CRIU_DIR", filepath.Dir(inDir))
	if got, err := Find(); err != nil || got != inDir {
		t.Fatalf("VIVARIUM_CRIU_DIR: %q %v", got, err)
	}
	named := fake(t, filepath.Join(dir, "named"), "echo 'Version: 4.1'")
	t.Setenv("VIVARIUM_CRIU", named)
	if got, err := Find(); err != nil || got != named {
		t.Fatalf("VIVARIUM_CRIU: %q %v", got, err)
	}
}

func TestCheckReportsFailure(t *testing.T) {
	dir := t.TempDir()
	bad := fake(t, dir, "echo 'Error (criu/cr-check.c:1): vdso'; echo 'Looks bad'; exit 1")
	if _, err := Check(context.Background(), bad); err == nil || !strings.Contains(err.Error(), "vdso") {
		t.Fatalf("a failing check: %v", err)
	}
	good := fake(t, filepath.Join(dir, "g"), "echo 'Warn (x): y'; echo 'Looks good.'")
	if said, err := Check(context.Background(), good); err != nil || said != "Looks good." {
		t.Fatalf("%q %v", said, err)
	}
}

// The real binary, where it is built: `criu check` passes on this kernel.
// realCRIU returns the criu built here, skipping where there is none or
// the test is not root (criu check needs it).
func realCRIU(t *testing.T) string {
	t.Helper()
	testutil.RequireRoot(t, "criu check")
	bin, err := Find()
	if err != nil {
		t.Skipf("criu is not built here (make criu): %v", err)
	}
	return bin
}

func TestCheckRealBinary(t *testing.T) {
	bin := realCRIU(t)
	said, err := Check(context.Background(), bin)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := Version(bin)
	t.Logf("%s (criu %s): %s", bin, v, said)
}

// A CRIU that is there but fails `criu check` on this kernel is not
// usable, and says why with what the check printed; one that passes is.
func TestUsable(t *testing.T) {
	dir := t.TempDir()
	broken := fake(t, filepath.Join(dir, "broken"), `case "$1" in
--version) echo 'Version: 4.1.1';;
check) echo 'Error (criu/vdso.c:613): vdso: Failed to fill self vdso symtable' >&2; exit 1;;
esac`)
	t.Setenv("VIVARIUM_CRIU", broken)
	if _, err := Usable(); err == nil || !strings.Contains(err.Error(), "cannot work on this host") ||
		!strings.Contains(err.Error(), "vdso") {
		t.Fatalf("a CRIU whose check fails: %v", err)
	}
	good := fake(t, filepath.Join(dir, "good"), `case "$1" in
--version) echo 'Version: 4.1.1';;
check) echo 'Looks good.';;
esac`)
	t.Setenv("VIVARIUM_CRIU", good)
	if got, err := Usable(); err != nil || got != good {
		t.Fatalf("a CRIU whose check passes: %q %v", got, err)
	}
}

// criu's kernel probes are kept in a directory of this user's on a tmpfs,
// and never in one that another user made, a symlink, or one on a disk
// (which a reboot into another kernel would not clear).
func TestPrivateTmpfsDir(t *testing.T) {
	if st, err := os.Stat("/dev/shm"); err != nil || !st.IsDir() {
		t.Skip("no /dev/shm here")
	}
	base, err := os.MkdirTemp("/dev/shm", "vivarium-criu-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	own := filepath.Join(base, "own")
	if got := privateTmpfsDir(own); got != own {
		t.Fatalf("a new directory on a tmpfs: %q", got)
	}
	if st, err := os.Stat(own); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("its mode: %v %v", st.Mode(), err)
	}
	if got := privateTmpfsDir(own); got != own {
		t.Fatalf("found again: %q", got)
	}
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o777)
	link := filepath.Join(base, "link")
	if err := os.Symlink(own, link); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{open, link, filepath.Join(t.TempDir(), "disk")} {
		if got := privateTmpfsDir(dir); got != "" {
			t.Errorf("%s: used (%q)", dir, got)
		}
	}
	if os.Geteuid() == 0 {
		theirs := filepath.Join(base, "theirs")
		if err := os.Mkdir(theirs, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(theirs, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if got := privateTmpfsDir(theirs); got != "" {
			t.Errorf("another user's directory: used (%q)", got)
		}
	}
}

// A criu built with scripts/criu/kdat-dir.patch probes the kernel once:
// its second run loads what the first kept.
func TestKdatKept(t *testing.T) {
	bin := realCRIU(t)
	if _, err := os.Stat(filepath.Join(filepath.Dir(bin), "BUILD-INFO")); err != nil ||
		len(MissingPatches(bin, []string{"kdat-dir.patch"})) > 0 {
		t.Skipf("%s is built without kdat-dir.patch", bin)
	}
	if kdatDir() == "" {
		t.Skip("no private directory on a tmpfs for the cache here")
	}
	for i := 0; i < 2; i++ {
		dir := t.TempDir()
		if err := Run(context.Background(), bin, []string{"check", "--images-dir", dir, "--log-file", "check.log", "-v4"},
			nil, dir, "check.log"); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			continue
		}
		log, err := os.ReadFile(filepath.Join(dir, "check.log"))
		if err != nil {
			t.Fatal(err)
		}
		if want := "Loaded kdat cache from " + kdatDir() + "/criu.kdat"; !strings.Contains(string(log), want) {
			t.Fatalf("the second run did not load the kept probes (%q):\n%s", want, lastLines(string(log), 20))
		}
	}
}

// A criu that never ends (a restore waiting for a task that died) is
// killed after MaxRun, with the helpers it started, and the run fails
// saying so.
func TestRunBounded(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "criu")
	pidfile := filepath.Join(dir, "helper.pid")
	// The helper keeps criu's output open, as criu's own helpers do.
	script := "#!/bin/sh\nsleep 600 &\necho $! > " + pidfile + "\nsleep 600\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	defer func(d time.Duration) { MaxRun = d }(MaxRun)
	MaxRun = time.Second
	start := time.Now()
	err := Run(context.Background(), bin, []string{"restore"}, nil, dir, "restore.log")
	if err == nil || !strings.Contains(err.Error(), "killed after 1s") {
		t.Fatalf("a criu that never ends: %v", err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("Run returned after %v", took)
	}
	b, err := os.ReadFile(pidfile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(st), ") Z ") {
			break // gone, or a zombie for its parent (init) to reap
		}
		if time.Now().After(deadline) {
			t.Fatalf("criu's helper %d outlived it", pid)
		}
	}
}
