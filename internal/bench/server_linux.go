package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// server is a `vivarium serve` the HTTP rows share: started by the first
// row's Setup, stopped by the last row's Teardown. It runs with its
// defaults (a zygote preloading numpy, pandas and matplotlib, a pool of
// ready sandboxes), in development mode on a free loopback port, with a
// cgroup parent of its own.
type server struct {
	bin string
	// parent and uidBase keep the server's sandboxes apart from other
	// servers'; keys, when set, are the names of the API keys the server
	// is made with (it then runs without --dev), tokens their tokens;
	// extra are more flags of serve.
	parent  string
	uidBase int
	keys    []string
	tokens  map[string]string
	extra   []string
	// holds is how many sandboxes the server must hold at once (W5's
	// --idle and --fill); its pool of host users and its --max-sandboxes
	// are made that large.
	holds int

	mu    sync.Mutex
	users int
	cmd   *exec.Cmd
	url   string
	data  string
	err   error
	log   capBuffer
	http  *http.Client
	wait  chan struct{}
	reaps sync.WaitGroup // sandboxes being deleted in the background
	// cpu reads what the server and its sandboxes spent (W8), made on
	// first use.
	cpu    *cpuMeter
	cpuErr error
}

// serverParent is the bench server's cgroup parent: its sandboxes' memory
// is read from there. Named by the bench's process, so that two benches
// on one host do not refuse each other's servers; removed when its
// server has stopped.
var serverParent = fmt.Sprintf("vivarium-bench-serve-%d", os.Getpid())

func newServer(bin string) *server {
	// Its host users start where no other server of the bench's does, so
	// that thousands (--fill) fit below 2^32.
	return &server{bin: bin, parent: serverParent, uidBase: 1_000_000_000 + 16<<24,
		http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
}

func (s *server) acquire(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users++
	if s.cmd != nil || s.err != nil {
		return s.err
	}
	s.err = s.start(ctx)
	return s.err
}

func (s *server) release() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.users--; s.users > 0 || s.cmd == nil {
		return nil
	}
	s.reaps.Wait()
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.wait:
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
		<-s.wait
	}
	s.cmd = nil
	if s.cpu != nil {
		s.cpu.self.Destroy()
	}
	s.cpu, s.cpuErr = nil, nil
	os.RemoveAll(s.data)
	// The parent is named by this process: nothing else will remove it,
	// nor the groups named after it (the meter's own, serve's for gvisor).
	for _, g := range []string{s.parent, s.parent + "-self", s.parent + "-gvisor"} {
		cgroups.RemoveEmpty(g)
	}
	return nil
}

func (s *server) start(ctx context.Context) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := l.Addr().String()
	l.Close()
	if s.data, err = os.MkdirTemp("", "vivarium-bench-"); err != nil {
		return err
	}
	args := []string{"serve", "--listen", addr, "--data-dir", s.data,
		"--cgroup-parent", s.parent, "--uid-base", fmt.Sprint(s.uidBase), "--uid-ranges", fmt.Sprint(max(256, s.holds+64)),
		"--max-sandboxes", fmt.Sprint(max(2000, s.holds+64)), "--max-sandboxes-per-key", fmt.Sprint(max(2000, s.holds+64)),
		"--max-executions", "512", "--max-executions-per-key", "512", "--log-level", "warn"}
	if len(s.keys) == 0 {
		args = append(args, "--dev")
	}
	s.tokens = map[string]string{}
	for _, name := range s.keys {
		out, err := exec.CommandContext(ctx, s.bin, "keys", "create", "--data-dir", s.data, name).Output()
		if err != nil {
			return fmt.Errorf("vivarium keys create: %w", err)
		}
		s.tokens[name] = strings.TrimSpace(string(out))
	}
	cmd := exec.Command(s.bin, append(args, s.extra...)...)
	cmd.Stdout, cmd.Stderr = &s.log, &s.log
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd, s.url, s.wait = cmd, "http://"+addr, make(chan struct{})
	go func() { cmd.Wait(); close(s.wait) }()
	deadline := time.Now().Add(3 * time.Minute) // the zygote imports pandas first
	for time.Now().Before(deadline) {
		select {
		case <-s.wait:
			return fmt.Errorf("vivarium serve exited: %s", lastLine(s.log.String()))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if resp, err := s.http.Get(s.url + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
	}
	return errors.New("vivarium serve did not answer within 3 minutes")
}

// post sends v as JSON and decodes the answer into out.
func (s *server) post(ctx context.Context, method, path string, v, out any) error {
	return s.postAs(ctx, "", method, path, v, out)
}

// postAs is post with the API key named key ("": none, as with --dev).
func (s *server) postAs(ctx context.Context, key, method, path string, v, out any) error {
	var body io.Reader
	if v != nil {
		b, _ := json.Marshal(v)
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+s.tokens[key])
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(raw))
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

// oneShot is P1/P2: POST /v1/execute, a fresh sandbox per request.
func (s *server) oneShot(w Workload) func(context.Context) error {
	return func(ctx context.Context) error {
		var res sandbox.Result
		if err := s.post(ctx, "POST", "/v1/execute", map[string]any{"code": w.Code}, &res); err != nil {
			return err
		}
		return checkResult(&res, w.Want)
	}
}

// poolSettled waits until the server's pool makes no sandbox: every
// configuration it keeps ready is as deep as its target (a one-shot
// starts the refill of its configuration as it takes its sandbox), or a
// creation failed.
func (s *server) poolSettled(ctx context.Context) error {
	for {
		req, err := http.NewRequestWithContext(ctx, "GET", s.url+"/metrics", nil)
		if err != nil {
			return err
		}
		resp, err := s.http.Do(req)
		if err != nil {
			return err
		}
		raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if err != nil {
			return err
		}
		if bytes.Contains(raw, []byte("\nvivarium_pool_creating 0\n")) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the server's pool did not fill: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// create is P6: POST /v1/sandboxes until the sandbox is ready for code;
// it is deleted afterwards, in the background and untimed.
func (s *server) create(ctx context.Context) error {
	var info struct{ ID string }
	if err := s.post(ctx, "POST", "/v1/sandboxes", nil, &info); err != nil {
		return err
	}
	s.reaps.Add(1)
	go func() {
		defer s.reaps.Done()
		s.post(context.Background(), "DELETE", "/v1/sandboxes/"+info.ID, nil, nil)
	}()
	return nil
}

// e2bCreate is E2B's Sandbox.create through the server's E2B API: the
// call the SDKs make (the code interpreter's template, a timeout), then
// its kill.
func (s *server) e2bCreate(ctx context.Context) error {
	var info struct{ SandboxID string }
	if err := s.post(ctx, "POST", "/e2b/sandboxes", map[string]any{"templateID": "code-interpreter-v1", "timeout": 300}, &info); err != nil {
		return err
	}
	if info.SandboxID == "" {
		return errors.New("E2B's create answered no sandboxID")
	}
	s.reaps.Add(1)
	go func() {
		defer s.reaps.Done()
		s.post(context.Background(), "DELETE", "/e2b/sandboxes/"+info.SandboxID, nil, nil)
	}()
	return nil
}

// warm is P4: executions in live stateful sandboxes over HTTP, one per
// concurrent caller.
func (s *server) warm(w Workload) (setup func(context.Context) error, run func(context.Context) error, teardown func() error) {
	p := newPool(func(ctx context.Context) (string, error) {
		var info struct{ ID string }
		if err := s.post(ctx, "POST", "/v1/sandboxes", nil, &info); err != nil {
			return "", err
		}
		var res sandbox.Result
		if err := s.post(ctx, "POST", "/v1/sandboxes/"+info.ID+"/execute", map[string]any{"code": w.Init}, &res); err != nil {
			return "", err
		}
		return info.ID, checkResult(&res, "")
	}, func(id string) error { return s.post(context.Background(), "DELETE", "/v1/sandboxes/"+id, nil, nil) })
	setup = func(ctx context.Context) error {
		if err := s.acquire(ctx); err != nil {
			return err
		}
		return p.with(ctx, func(string) error { return nil })
	}
	run = func(ctx context.Context) error {
		return p.with(ctx, func(id string) error {
			var res sandbox.Result
			if err := s.post(ctx, "POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"code": w.Code}, &res); err != nil {
				return err
			}
			return checkResult(&res, w.Want)
		})
	}
	teardown = func() error {
		err := p.closeAll()
		return errors.Join(err, s.release())
	}
	return setup, run, teardown
}

// sandboxGroups lists the sandbox cgroups under parent (not the zygote's),
// those in a tenant's group (parent/TENANT/SANDBOX) included.
func sandboxGroups(parent string) []string {
	sandboxes, _ := parentGroups(parent)
	return sandboxes
}

// zygoteGroups lists the zygotes' cgroups under parent.
func zygoteGroups(parent string) []string {
	_, zygotes := parentGroups(parent)
	return zygotes
}

// parentGroups lists the sandbox and the zygote cgroups under parent, in
// the pids hierarchy on cgroup v1.
func parentGroups(parent string) (sandboxes, zygotes []string) {
	for _, root := range []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup"} {
		entries, err := os.ReadDir(filepath.Join(root, parent))
		if err != nil {
			continue
		}
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			dir := filepath.Join(root, parent, e.Name())
			if strings.HasPrefix(e.Name(), "zygote-") {
				zygotes = append(zygotes, dir)
				continue
			}
			subs, _ := os.ReadDir(dir)
			tenant := false
			for _, sub := range subs {
				if sub.IsDir() {
					tenant = true
					sandboxes = append(sandboxes, filepath.Join(dir, sub.Name()))
				}
			}
			if !tenant {
				sandboxes = append(sandboxes, dir)
			}
		}
		if len(sandboxes)+len(zygotes) > 0 {
			return sandboxes, zygotes
		}
	}
	return sandboxes, zygotes
}

// groupProcesses lists the processes of the cgroups.
func groupProcesses(groups []string) []int {
	var pids []int
	for _, g := range groups {
		b, err := os.ReadFile(filepath.Join(g, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// parentMemory is the memory charged to the cgroup parent (its sandboxes
// and zygotes, what the kernel keeps for them included) and its limit,
// the server's --max-memory-total (0: none, or not read).
func parentMemory(parent string) (charge, limit int64) {
	for _, f := range [][2]string{
		{"/sys/fs/cgroup/memory/" + parent + "/memory.usage_in_bytes", "/sys/fs/cgroup/memory/" + parent + "/memory.limit_in_bytes"},
		{"/sys/fs/cgroup/" + parent + "/memory.current", "/sys/fs/cgroup/" + parent + "/memory.max"},
	} {
		if c := readProcInt(f[0]); c > 0 {
			if l := readProcInt(f[1]); l > 0 && l < 1<<60 {
				limit = l
			}
			return c, limit
		}
	}
	return 0, 0
}

// groupMemory is the memory charged to a cgroup parentGroups listed (in
// the pids hierarchy on cgroup v1: its memory hierarchy is read); 0 when
// it cannot be read.
func groupMemory(dir string) int64 {
	if rel, ok := strings.CutPrefix(dir, "/sys/fs/cgroup/pids/"); ok {
		return readProcInt(filepath.Join("/sys/fs/cgroup/memory", rel, "memory.usage_in_bytes"))
	}
	return readProcInt(filepath.Join(dir, "memory.current"))
}

// openFiles is the server process's open files and its limit on them.
func (s *server) openFiles() (open int, limit int64) {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		return 0, 0
	}
	pid := cmd.Process.Pid
	for _, l := range strings.Split(readProc(fmt.Sprintf("/proc/%d/limits", pid)), "\n") {
		if rest, ok := strings.CutPrefix(l, "Max open files"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				limit, _ = strconv.ParseInt(f[0], 10, 64)
			}
		}
	}
	return countDir(fmt.Sprintf("/proc/%d/fd", pid)), limit
}

// readProc reads a small kernel file; "" when it cannot.
func readProc(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

// readProcInt reads a kernel file that holds a number; 0 when it cannot.
func readProcInt(path string) int64 {
	n, _ := strconv.ParseInt(readProc(path), 10, 64)
	return n
}

// countDir is the number of entries of a directory (a process's fd or
// task directory); 0 when it cannot be read.
func countDir(path string) int {
	entries, _ := os.ReadDir(path)
	return len(entries)
}

// pythonPandasPSS is the floor of a design that shares nothing: the PSS of
// one python3 that imported pandas, as each sandbox of it would hold.
func pythonPandasPSS(python string) func(context.Context) (float64, error) {
	return func(ctx context.Context) (float64, error) {
		cmd := exec.CommandContext(ctx, python, "-c",
			"import pandas as pd, sys\ndf = pd.DataFrame({'a': range(100)})\nprint('ready', flush=True)\nsys.stdin.read()")
		cmd.Env = peerEnv()
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return 0, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return 0, err
		}
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		defer func() { stdin.Close(); cmd.Wait() }()
		buf := make([]byte, 6)
		if _, err := io.ReadFull(stdout, buf); err != nil || string(buf) != "ready\n" {
			return 0, fmt.Errorf("python3 did not import pandas: %v", err)
		}
		return float64(sandbox.ProcessPSS(cmd.Process.Pid)) / (1 << 20), nil
	}
}
