package testutil

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Dockerd is a Docker daemon of the tests' own: its data, state, pid file,
// configuration and socket live in a directory of its own, with no bridge
// and no iptables rules, so that it neither sees nor touches another
// daemon or the host's network. With runsc installed it has runsc
// registered as a runtime.
type Dockerd struct {
	Dir  string
	Host string // unix://DIR/docker.sock
	cmd  *exec.Cmd
	done chan struct{}
}

var (
	dockerdMu  sync.Mutex
	dockerd    *Dockerd
	dockerdErr error
)

// RequireDockerd returns the package's test daemon, started at the first
// call; the test skips, saying why, where it cannot start (not root,
// docker.io not installed). The package's TestMain stops it with
// StopDockerd.
func RequireDockerd(t testing.TB) *Dockerd {
	t.Helper()
	RequireRoot(t)
	if _, err := exec.LookPath("dockerd"); err != nil {
		t.Skip("needs dockerd (apt install docker.io)")
	}
	dockerdMu.Lock()
	defer dockerdMu.Unlock()
	if dockerd == nil && dockerdErr == nil {
		dockerd, dockerdErr = StartDockerd()
	}
	if dockerdErr != nil {
		t.Fatalf("start a test dockerd: %v", dockerdErr)
	}
	return dockerd
}

// StopDockerd stops the daemon RequireDockerd started, if any.
func StopDockerd() error {
	dockerdMu.Lock()
	defer dockerdMu.Unlock()
	if dockerd == nil {
		return nil
	}
	err := dockerd.Stop()
	dockerd = nil
	return err
}

// StartDockerd starts a daemon and waits until it answers.
func StartDockerd() (*Dockerd, error) {
	bin, err := exec.LookPath("dockerd")
	if err != nil {
		return nil, errors.New("dockerd is not installed (apt install docker.io)")
	}
	sweepDockerds()
	// Short: the sockets under it must fit in a sockaddr_un.
	dir, err := os.MkdirTemp("", "vd-")
	if err != nil {
		return nil, err
	}
	d := &Dockerd{Dir: dir, Host: "unix://" + filepath.Join(dir, "docker.sock"), done: make(chan struct{})}
	// runsc without a network of its own: the sandbox has loopback only,
	// as Docker's "none" network (runsc's default, a network stack fed from
	// the container's namespace, refuses the namespace Docker gives it when
	// dockerd itself runs in a container).
	conf := "{}\n"
	if runsc, err := exec.LookPath("runsc"); err == nil {
		conf = `{"runtimes": {"runsc": {"path": "` + runsc + `", "runtimeArgs": ["--network=none"]}}}` + "\n"
	}
	config := filepath.Join(dir, "daemon.json")
	if err := os.WriteFile(config, []byte(conf), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	log, err := os.Create(filepath.Join(dir, "dockerd.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	defer log.Close()
	args := []string{
		"--config-file", config,
		"--data-root", filepath.Join(dir, "data"),
		"--exec-root", filepath.Join(dir, "exec"),
		"--pidfile", filepath.Join(dir, "dockerd.pid"),
		"--host", d.Host,
		"--iptables=false", "--ip-masq=false", "--bridge=none", "--userland-proxy=false",
		"--exec-opt", "native.cgroupdriver=cgroupfs",
	}
	d.cmd = exec.Command(bin, args...)
	d.cmd.Stdout, d.cmd.Stderr = log, log
	// The daemon is told to stop when the test binary dies (a timeout's
	// panic): Pdeathsig fires when the thread that started it ends, so it
	// is started from a thread kept for as long as the daemon runs.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	started := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := d.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		d.cmd.Wait()
		close(d.done)
	}()
	if err := <-started; err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", filepath.Join(dir, "docker.sock"))
		}}}
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := hc.Get("http://docker/_ping")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				hc.CloseIdleConnections()
				return d, nil
			}
		}
		select {
		case <-d.done:
			d.Stop()
			return nil, fmt.Errorf("dockerd exited: %s", d.logTail())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.Stop()
			return nil, fmt.Errorf("dockerd did not answer within 90s: %s", d.logTail())
		}
	}
}

func (d *Dockerd) logTail() string {
	b, _ := os.ReadFile(filepath.Join(d.Dir, "dockerd.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Stop stops the daemon (SIGTERM, then SIGKILL after 30 s), ends what it
// left running (containerd, shims), unmounts what it left mounted and
// removes its directory.
func (d *Dockerd) Stop() error {
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
	}
	// Its containerd and shims name its directory in their arguments.
	for range 50 {
		pids := processesNaming(d.Dir)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var errs []error
	for _, m := range mountsUnder(d.Dir) {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	if err := os.RemoveAll(d.Dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// sweepDockerds removes what test daemons of killed test binaries left (a
// binary that panics on its -timeout never reaches TestMain's end; its
// daemon gets SIGTERM, but its directory, mounts and its backends' state
// directories stay): each /tmp/vd-* directory older than a minute that no
// process names, the mounts under it, and the /run/vivarium directories
// named after it (the tests' backends end their names with its suffix).
func sweepDockerds() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "vd-*"))
	for _, dir := range dirs {
		fi, err := os.Lstat(dir)
		// Young: a daemon starting (the directory is made first).
		if err != nil || !fi.IsDir() || time.Since(fi.ModTime()) < time.Minute || len(processesNaming(dir)) > 0 {
			continue
		}
		suffix := strings.TrimPrefix(filepath.Base(dir), "vd-")
		states, _ := filepath.Glob("/run/vivarium/*-" + suffix)
		for _, d := range append(states, dir) {
			for _, m := range mountsUnder(d) {
				syscall.Unmount(m, syscall.MNT_DETACH)
			}
			os.RemoveAll(d)
		}
	}
}

// processesNaming lists the processes whose command line contains s.
func processesNaming(s string) []int {
	var out []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil || !strings.Contains(string(b), s) {
			continue
		}
		var pid int
		if _, err := fmt.Sscan(filepath.Base(dir), &pid); err == nil && pid != os.Getpid() {
			out = append(out, pid)
		}
	}
	return out
}

// mountsUnder lists the mount points under dir, deepest first.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}
