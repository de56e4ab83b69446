//go:build linux

package kube

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
	"github.com/vivarium-sandbox/vivarium/internal/testutil/kubetest"
)

// The pause image scripts/kube/node.sh builds, which containerd's CRI
// plugin starts as every pod's sandbox.
const pauseImage = "localhost/vivarium-test/pause:1"

// findNodeBuild returns the directory scripts/kube/node.sh built into:
// $VIVARIUM_KUBE_NODE_DIR, else the newest kubenode-*/ under
// ${XDG_CACHE_HOME:-$HOME/.cache}/vivarium holding a kubelet.
func findNodeBuild() (string, error) {
	dir := os.Getenv("VIVARIUM_KUBE_NODE_DIR")
	if dir == "" {
		built, pattern := fileutil.CachedBuilds("kubenode", "kubelet")
		if len(built) == 0 {
			return "", fmt.Errorf("no kubelet in %s: run scripts/kube/node.sh", pattern)
		}
		dir = filepath.Dir(built[0])
	}
	for _, f := range []string{"kubelet", "kube-controller-manager", "kube-scheduler", "pause.tar"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return "", fmt.Errorf("%s: %v: run scripts/kube/node.sh", dir, err)
		}
	}
	return dir, nil
}

// steps runs the test's steps in order, logs each with its time, and on
// a failure says which step failed and which had been done: how far the
// cluster got.
type steps struct {
	t     *testing.T
	begin time.Time
	done  []string
}

func newSteps(t *testing.T) *steps {
	s := &steps{t: t, begin: time.Now()}
	t.Cleanup(func() {
		t.Logf("steps done (%d):\n  %s", len(s.done), strings.Join(s.done, "\n  "))
	})
	return s
}

func (s *steps) do(name string, f func() error) {
	s.t.Helper()
	n := len(s.done) + 1
	s.t.Logf("step %d: %s ...", n, name)
	start := time.Now()
	if err := f(); err != nil {
		s.t.Fatalf("step %d (%s) failed after %v, %v into the test: %v",
			n, name, time.Since(start).Round(time.Millisecond), time.Since(s.begin).Round(time.Second), err)
	}
	line := fmt.Sprintf("%d. %s: %v", n, name, time.Since(start).Round(time.Millisecond))
	s.done = append(s.done, line)
	s.t.Logf("step %s", line)
}

// shortTempDir is a directory of the test's under /tmp with a short
// name: containerd's socket, and its shims' derived from it, must fit a
// unix socket's 108 bytes, which t.TempDir's long names can exceed.
func shortTempDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "vkn-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	return dir
}

// daemon is one process of the cluster, its output in a log file.
type daemon struct {
	name   string
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
}

// start starts a daemon, with a parent-death signal (a test binary that
// dies takes it along), and registers its stop: SIGTERM, then SIGKILL
// after grace.
func (n *node) start(name string, grace time.Duration, argv ...string) (*daemon, error) {
	d := &daemon{name: name, log: filepath.Join(n.dir, name+".log"), exited: make(chan struct{})}
	f, err := os.Create(d.log)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	d.cmd = exec.Command(argv[0], argv[1:]...)
	d.cmd.Stdout, d.cmd.Stderr = f, f
	d.cmd.Dir = n.dir
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		d.cmd.Wait()
		close(d.exited)
	}()
	n.t.Cleanup(func() {
		if n.t.Failed() {
			n.t.Logf("last lines of %s's log:\n%s", name, tailFile(d.log, 25))
		}
		d.stop(grace)
	})
	return d, nil
}

func (d *daemon) stop(grace time.Duration) {
	select {
	case <-d.exited:
		return
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(grace):
		d.cmd.Process.Kill()
		<-d.exited
	}
}

func (d *daemon) running() error {
	select {
	case <-d.exited:
		return fmt.Errorf("%s exited (%v); last lines of its log:\n%s", d.name, d.cmd.ProcessState, tailFile(d.log, 30))
	default:
		return nil
	}
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitFor polls cond every 250 ms until it is done (nil) or timeout
// passes, and returns its last error.
func waitFor(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %w", timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func run(argv ...string) error {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// bridge makes the pods' bridge with the host's address on it, before
// the API server binds that address; the CNI bridge plugin then finds it
// and adds the pods' veths. Nothing else of the host's network changes:
// no masquerading (pods reach only the host and each other), no
// kube-proxy rules.
func (n *node) bridge() error {
	if _, err := net.InterfaceByName(bridgeName); err == nil {
		return fmt.Errorf("%s exists already (another run of this test, or one that was killed: ip link del %s)", bridgeName, bridgeName)
	}
	out, _ := exec.Command("ip", "-4", "route", "show", podSubnet).Output()
	if len(strings.TrimSpace(string(out))) > 0 {
		return fmt.Errorf("%s is routed already: %s", podSubnet, out)
	}
	if err := run("ip", "link", "add", bridgeName, "type", "bridge"); err != nil {
		return err
	}
	n.t.Cleanup(func() {
		if err := run("ip", "link", "del", bridgeName); err != nil {
			n.t.Errorf("teardown: %v", err)
		}
	})
	if err := run("ip", "addr", "add", bridgeCIDR, "dev", bridgeName); err != nil {
		return err
	}
	return run("ip", "link", "set", bridgeName, "up")
}

// cgroupRoot makes the kubelet's --cgroup-root, a group of the test's
// own in every v1 hierarchy (the kubelet refuses a root that is missing
// in one), and removes it when the test ends, killing what is left in
// it.
func (n *node) cgroupRoot() error {
	if st, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil && !st.IsDir() {
		return errors.New("cgroup v2 only: this test configures the kubelet for cgroup v1 (cgroupfs)")
	}
	n.cgroup = "/vivarium-kube-" + randHex(4)
	var made []string
	for _, h := range cgroupV1Hierarchies() {
		p := filepath.Join(h, n.cgroup)
		if err := os.Mkdir(p, 0o755); err != nil {
			return err
		}
		made = append(made, p)
	}
	if len(made) == 0 {
		return errors.New("no cgroup v1 hierarchy mounted under /sys/fs/cgroup")
	}
	n.t.Cleanup(func() {
		for _, p := range made {
			if err := removeCgroupTree(p); err != nil {
				n.t.Errorf("teardown: cgroup %s: %v", p, err)
			}
		}
	})
	return nil
}

// cgroupV1Hierarchies lists the v1 hierarchies mounted under
// /sys/fs/cgroup (cpu, memory, ..., name=systemd's).
func cgroupV1Hierarchies() []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		i := 6
		for i < len(f) && f[i] != "-" {
			i++
		}
		if i+1 < len(f) && f[i+1] == "cgroup" && strings.HasPrefix(f[4], "/sys/fs/cgroup/") && f[3] == "/" {
			out = append(out, f[4])
		}
	}
	return out
}

// removeCgroupTree kills the processes left in a group and its
// descendants, and removes them, children first.
func removeCgroupTree(root string) error {
	var dirs []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	var last error
	for _, d := range dirs {
		for try := 0; try < 50; try++ {
			b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			if last = os.Remove(d); last == nil || os.IsNotExist(last) {
				last = nil
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return last
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// containerd starts containerd with a configuration, root, state,
// socket and runc root of the test's own (the system's containerd, if
// any, is not touched), the CNI bridge plugin on the test's bridge, and
// the local pause image as every pod's sandbox.
func (n *node) containerd() error {
	cd := filepath.Join(n.dir, "containerd")
	n.sock = filepath.Join(cd, "sock")
	netd := filepath.Join(n.dir, "cni", "net.d")
	for _, d := range []string{cd, netd} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	cni := map[string]any{
		"cniVersion": "0.4.0",
		"name":       "vivarium-test",
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": bridgeName, "isGateway": true, "ipMasq": false, "hairpinMode": false,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  []any{[]any{map[string]any{"subnet": podSubnet, "gateway": hostIP}}},
				"dataDir": filepath.Join(n.dir, "cni", "ipam"),
			},
		}},
	}
	b, _ := json.MarshalIndent(cni, "", "  ")
	if err := os.WriteFile(filepath.Join(netd, "10-vivarium-test.conflist"), b, 0o600); err != nil {
		return err
	}
	// restrict_oom_score_adj: the CRI plugin gives pod sandboxes an OOM
	// score of -998, which only CAP_SYS_RESOURCE may set, and this
	// machine's root does not have it; restricted, no score is set below
	// containerd's own.
	cfg := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = %[3]q
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        Root = %[6]q
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[7]q
    max_conf_num = 1
`, filepath.Join(cd, "root"), filepath.Join(cd, "state"), n.sock, filepath.Join(cd, "opt"), pauseImage,
		filepath.Join(cd, "runc"), netd)
	cfgPath := filepath.Join(cd, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return err
	}
	// Cleanups run last-registered first: the containers are removed
	// while containerd runs, what is left of them once it has stopped.
	netnsBefore := netnsNames()
	_, err := os.Stat(cniCache)
	n.cniCacheExisted = err == nil
	n.t.Cleanup(func() { n.afterContainerd(netnsBefore) })
	d, err := n.start("containerd", 20*time.Second, "containerd", "--config", cfgPath)
	if err != nil {
		return err
	}
	n.t.Cleanup(n.removeContainers)
	return waitFor(30*time.Second, func() error {
		if err := d.running(); err != nil {
			return err
		}
		return n.ctr("version")
	})
}

func (n *node) ctr(args ...string) error {
	return run(append([]string{"ctr", "--address", n.sock, "--namespace", "k8s.io"}, args...)...)
}

func (n *node) ctrOutput(args ...string) string {
	out, _ := exec.Command("ctr", append([]string{"--address", n.sock, "--namespace", "k8s.io"}, args...)...).Output()
	return string(out)
}

// removeContainers runs after the kubelet has stopped, before containerd
// does: it kills and deletes the containers left (a test that failed
// before its pods were deleted; none otherwise).
func (n *node) removeContainers() {
	if tasks := strings.Fields(n.ctrOutput("tasks", "ls", "-q")); len(tasks) > 0 {
		n.t.Logf("teardown: %d containers still running, killed", len(tasks))
		for _, id := range tasks {
			n.ctr("tasks", "kill", "-s", "SIGKILL", id)
		}
		time.Sleep(time.Second)
		for _, id := range tasks {
			n.ctr("tasks", "delete", "-f", id)
		}
	}
	for _, id := range strings.Fields(n.ctrOutput("containers", "ls", "-q")) {
		n.ctr("containers", "delete", id)
	}
}

// afterContainerd runs once containerd has stopped: it kills shims still
// serving its socket (a shim outlives containerd by design), unmounts
// what is left under the test's directory and deletes the network
// namespaces the CRI plugin made that are still there (their veths go
// with them).
func (n *node) afterContainerd(netnsBefore map[string]bool) {
	for _, pid := range processesMentioning(n.dir) {
		n.t.Logf("teardown: killing pid %d, still running: %s", pid, cmdline(pid))
		syscall.Kill(pid, syscall.SIGKILL)
	}
	time.Sleep(200 * time.Millisecond)
	unmountUnder(n.t, n.dir)
	removeCNICache(n.t, n.cniCacheExisted)
	for name := range netnsNames() {
		if !netnsBefore[name] && strings.HasPrefix(name, "cni-") {
			n.t.Logf("teardown: network namespace %s left, deleted", name)
			if err := run("ip", "netns", "delete", name); err != nil {
				n.t.Errorf("teardown: %v", err)
			}
		}
	}
}

// cniCache is where libcni, in containerd, keeps each attachment's
// result until the network is torn down (not configurable in containerd
// 1.6). The kubelet's teardown of a pod removes its entries; a test that
// failed before leaves them.
const cniCache = "/var/lib/cni"

// cniCacheLeft lists the cached results of this test's network.
func cniCacheLeft() []string {
	left, _ := filepath.Glob(filepath.Join(cniCache, "results", "vivarium-test-*"))
	return left
}

// removeCNICache removes the cached results of this test's network and
// of the loopback attachments of the same sandboxes, and the cache
// directory itself if the test made it and nothing else is in it.
func removeCNICache(t *testing.T, existed bool) {
	for _, p := range cniCacheLeft() {
		id := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), "vivarium-test-"), "-eth0")
		os.Remove(p)
		os.Remove(filepath.Join(cniCache, "results", "cni-loopback-"+id+"-lo"))
	}
	if !existed {
		os.Remove(filepath.Join(cniCache, "results")) // fails unless empty
		os.Remove(cniCache)
	}
}

func netnsNames() map[string]bool {
	out := map[string]bool{}
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		out[e.Name()] = true
	}
	return out
}

// processesMentioning lists the processes whose command line names dir
// (containerd's shims name its socket), but this test's own.
func processesMentioning(dir string) []int {
	var out []int
	paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range paths {
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if pid == os.Getpid() {
			continue
		}
		b, _ := os.ReadFile(p)
		if strings.Contains(string(b), dir) {
			out = append(out, pid)
		}
	}
	return out
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// mountsUnder lists the mount points at or under dir, deepest first.
func mountsUnder(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

func unmountUnder(t *testing.T, dir string) {
	for _, m := range mountsUnder(dir) {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			t.Errorf("teardown: unmount %s: %v", m, err)
		}
	}
}

// images imports the pause image node.sh built, and Vivarium's as
// `make image` builds it (scripts/image.sh: its base, Debian with what
// sandboxes run, and this checkout's vivarium). The kubelet never pulls
// (imagePullPolicy Never).
func (n *node) images() error {
	start := time.Now()
	if err := n.ctr("images", "import", filepath.Join(n.build, "pause.tar")); err != nil {
		return err
	}
	n.t.Logf("  %s imported in %v", pauseImage, time.Since(start).Round(time.Millisecond))

	start = time.Now()
	checkout := filepath.Join(chartDir(n.t), "..", "..", "..")
	n.vivarium = filepath.Join(n.dir, "vivarium")
	build := exec.Command("scripts/build.sh", n.vivarium)
	build.Dir = checkout
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("scripts/build.sh: %v\n%s", err, out)
	}
	archive := filepath.Join(n.dir, "vivarium-image.tar")
	image := exec.Command("scripts/image.sh", archive)
	image.Dir = checkout
	var stderr bytes.Buffer
	image.Stderr = &stderr
	out, err := image.Output()
	if err != nil {
		return fmt.Errorf("scripts/image.sh: %v\n%s", err, stderr.String())
	}
	n.image = "docker.io/library/" + strings.TrimSpace(string(out))
	n.t.Logf("  make image: %s in %v", n.image, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	if err := n.ctr("images", "import", archive); err != nil {
		return err
	}
	os.Remove(archive)
	n.t.Logf("  %s imported (and unpacked) in %v", n.image, time.Since(start).Round(time.Millisecond))
	return nil
}

// controlPlane starts the controller manager (Deployments' ReplicaSets,
// DaemonSets' pods, service accounts, the kube-root-ca.crt ConfigMaps
// that pods' tokens come with, garbage collection) and the scheduler, as
// the API server's admin, serving nothing themselves.
func (n *node) controlPlane() error {
	admin := n.kc.Kubeconfig(kubetest.AdminUser)
	cm, err := n.start("kube-controller-manager", 5*time.Second, filepath.Join(n.build, "kube-controller-manager"),
		"--kubeconfig="+admin, "--leader-elect=false", "--secure-port=0",
		"--root-ca-file="+n.kc.CAFile, "--use-service-account-credentials=false",
		"--cluster-name=vivarium-test")
	if err != nil {
		return err
	}
	sched, err := n.start("kube-scheduler", 5*time.Second, filepath.Join(n.build, "kube-scheduler"),
		"--kubeconfig="+admin, "--leader-elect=false", "--secure-port=0")
	if err != nil {
		return err
	}
	// Ready when the "default" namespace has its ServiceAccount (the
	// controller manager works) and both are still running.
	return waitFor(60*time.Second, func() error {
		for _, d := range []*daemon{cm, sched} {
			if err := d.running(); err != nil {
				return err
			}
		}
		code, body := n.kc.Do(n.t, n.kc.AdminToken, http.MethodGet, "/api/v1/namespaces/default/serviceaccounts/default", nil)
		if code != http.StatusOK {
			return fmt.Errorf("no default ServiceAccount yet: %d %s", code, body)
		}
		return nil
	})
}

// The values the kubelet wants for these sysctls; with
// protectKernelDefaults false it writes them host-wide, with true it
// refuses to start unless they hold. Neither suits a shared test
// machine: the kubelet runs in a mount namespace of its own in which
// these files read the values it wants, and the host keeps its own.
var kubeletSysctls = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// kubelet starts the kubelet and waits for its Node to be Ready. It runs
// in a mount namespace of its own (unshare), where
//   - the sysctls above read as it wants them (files bound over
//     /proc/sys's, which is private, so nothing reaches the host);
//   - /var/log and /var/lib are empty directories of the test's: the
//     kubelet links containers' logs into /var/log/containers, and keeps
//     its device plugins' socket in /var/lib/kubelet/device-plugins
//     whatever --root-dir says;
//   - its root directory is a shared mount, so that the volumes it mounts
//     there (secrets, service-account tokens) reach containerd's
//     namespace, the host's.
func (n *node) kubelet() error {
	root := filepath.Join(n.dir, "kubelet")
	logs := filepath.Join(n.dir, "pod-logs")
	fake := filepath.Join(n.dir, "sysctl")
	varlog := filepath.Join(n.dir, "varlog")
	varlib := filepath.Join(n.dir, "varlib")
	for _, d := range []string{root, logs, fake, varlog, filepath.Join(varlib, "kubelet")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := run("mount", "--bind", root, root); err != nil {
		return err
	}
	if err := run("mount", "--make-shared", root); err != nil {
		return err
	}
	script := "set -e\n"
	for k, v := range kubeletSysctls {
		p := filepath.Join(fake, strings.ReplaceAll(k, "/", "."))
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			return err
		}
		script += fmt.Sprintf("mount --bind %q /proc/sys/%s\n", p, k)
	}
	script += fmt.Sprintf("mount --bind %q /var/log\nmount --bind %q /var/lib\nexec \"$@\"\n", varlog, varlib)

	ports, err := freeTCPPorts(2)
	if err != nil {
		return err
	}
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://%[1]s
cgroupDriver: cgroupfs
cgroupRoot: %[2]s
failSwapOn: false
failCgroupV1: false
protectKernelDefaults: true
makeIPTablesUtilChains: false
oomScoreAdj: 0
address: %[3]s
port: %[4]d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %[5]d
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
authorization:
  mode: Webhook
podLogsDir: %[6]s
hairpinMode: none
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
  nodefs.inodesFree: 1%%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`, n.sock, n.cgroup, hostIP, ports[0], ports[1], logs)
	cfgPath := filepath.Join(n.dir, "kubelet.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return err
	}
	d, err := n.start("kubelet", 30*time.Second, "unshare", "--mount", "--propagation", "unchanged", "--",
		"/bin/sh", "-c", script, "kubelet",
		filepath.Join(n.build, "kubelet"),
		"--config="+cfgPath,
		"--kubeconfig="+n.kc.Kubeconfig("system:node:"+nodeName),
		"--root-dir="+root,
		"--cert-dir="+filepath.Join(root, "pki"),
		"--hostname-override="+nodeName,
		"--node-ip="+hostIP,
		"--pod-infra-container-image="+pauseImage,
		"--v=2")
	if err != nil {
		return err
	}
	n.kubeletD = d
	return waitFor(3*time.Minute, func() error {
		if err := d.running(); err != nil {
			return err
		}
		code, body := n.kc.Do(n.t, n.kc.AdminToken, http.MethodGet, "/api/v1/nodes/"+nodeName, nil)
		if code != http.StatusOK {
			return fmt.Errorf("no Node %s yet: %d", nodeName, code)
		}
		var nd struct {
			Status struct {
				Conditions []struct{ Type, Status, Reason, Message string }
			}
		}
		json.Unmarshal(body, &nd)
		for _, c := range nd.Status.Conditions {
			if c.Type == "Ready" {
				if c.Status == "True" {
					return nil
				}
				return fmt.Errorf("Node %s: Ready=%s %s: %s", nodeName, c.Status, c.Reason, c.Message)
			}
		}
		return fmt.Errorf("Node %s has no Ready condition yet", nodeName)
	})
}

func freeTCPPorts(k int) ([]int, error) {
	var ports []int
	for range k {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// podLogs returns the last lines of every container's log the kubelet
// wrote.
func (n *node) podLogs(lines int) string {
	var b strings.Builder
	filepath.WalkDir(filepath.Join(n.dir, "pod-logs"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".log") {
			rel, _ := filepath.Rel(filepath.Join(n.dir, "pod-logs"), p)
			fmt.Fprintf(&b, "--- %s\n%s\n", rel, tailFile(p, lines))
		}
		return nil
	})
	if b.Len() == 0 {
		return "(no container logs)\n"
	}
	return b.String()
}

// checkLeftovers runs when everything else has stopped: nothing of the
// cluster may be left on the machine.
func (n *node) checkLeftovers() {
	netnsBefore := netnsNames()
	existedBefore := map[string]bool{}
	for _, p := range []string{"/var/log/containers", "/var/lib/kubelet"} {
		_, err := os.Stat(p)
		existedBefore[p] = err == nil
	}
	n.t.Cleanup(func() {
		var left []string
		for _, pid := range processesMentioning(n.dir) {
			left = append(left, fmt.Sprintf("process %d: %s", pid, cmdline(pid)))
			syscall.Kill(pid, syscall.SIGKILL)
		}
		for _, m := range mountsUnder(n.dir) {
			left = append(left, "mount "+m)
		}
		for name := range netnsNames() {
			if !netnsBefore[name] {
				left = append(left, "network namespace "+name)
			}
		}
		if _, err := net.InterfaceByName(bridgeName); err == nil {
			left = append(left, "link "+bridgeName)
		}
		for _, p := range cniCacheLeft() {
			left = append(left, "CNI result "+p)
		}
		for _, p := range []string{"/var/log/containers", "/var/lib/kubelet"} {
			if _, err := os.Stat(p); err == nil && !existedBefore[p] {
				left = append(left, p)
			}
		}
		if n.cgroup != "" {
			for _, h := range cgroupV1Hierarchies() {
				if _, err := os.Stat(filepath.Join(h, n.cgroup)); err == nil {
					left = append(left, "cgroup "+filepath.Join(h, n.cgroup))
				}
			}
		}
		if len(left) > 0 {
			n.t.Errorf("left behind:\n  %s", strings.Join(left, "\n  "))
		} else {
			n.t.Logf("nothing left behind: no process naming %s, no mount under it, no new network namespace, no %s, no cgroup %s", n.dir, bridgeName, n.cgroup)
		}
	})
}
