package gvisor_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/gvisor"
	"github.com/vivarium-sandbox/vivarium/internal/pool"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// A server's gVisor one-shots come from its pool (internal/pool over the
// gvisor backend): runsc sandboxes started beforehand, each used once and
// closed after. These tests drive that pool over real runsc sandboxes.

var oneShotSpec = sandbox.Spec{OneShot: true}

// poolOf starts a pool of gvisor one-shot sandboxes, n deep, and waits
// until it is full.
func poolOf(t *testing.T, b sandbox.Backend, n int) *pool.Pool {
	t.Helper()
	p := pool.New(pool.Config{Backend: b, Max: n, Min: n})
	p.Prewarm(oneShotSpec, n)
	waitReady(t, p, n)
	return p
}

func waitReady(t *testing.T, p *pool.Pool, n int) {
	t.Helper()
	testutil.WaitFor(t, 2*time.Minute, "the pool to hold ready gVisor sandboxes", func() bool {
		st := p.Stats()
		return len(st) == 1 && st[0].Ready == n && st[0].Creating == 0
	})
}

func hits(p *pool.Pool) int64 {
	var n int64
	for _, st := range p.Stats() {
		n += st.Hits
	}
	return n
}

// runPooled runs code as a one-shot through p, returns its result and
// the sandbox's id, and closes the sandbox.
func runPooled(t *testing.T, p *pool.Pool, code string, env map[string]string) (*sandbox.Result, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, sb, warn := sandbox.RunOnceOpen(ctx, p, sandbox.OneShot{Spec: oneShotSpec,
		Request: sandbox.ExecRequest{Code: code, Env: env}})
	if sb == nil {
		t.Fatalf("no sandbox: %+v", res)
	}
	if err := sb.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if warn != nil {
		t.Error(warn)
	}
	if res.Status != sandbox.StatusOK {
		t.Fatalf("%s: %+v", code, res)
	}
	return res, sb.ID()
}

// Two one-shots from one pool, the second's sandbox started before the
// first ran: nothing of the first reaches the second (files in the
// workspace, /tmp and /dev/shm, the environment, variables, processes),
// each is a sandbox of its own, and the first's container is gone once
// closed.
func TestPooledOneShotsAreFresh(t *testing.T) {
	dir := t.TempDir()
	b := pauseBackend(t, gvisor.Config{StateDir: dir, CheckpointDir: t.TempDir()})
	p := poolOf(t, b, 2)
	defer p.Close()
	before := containers(t, dir)

	_, first := runPooled(t, p, `
import os, subprocess
for d in ('/workspace', '/tmp', '/dev/shm'):
    open(d + '/leak', 'w').write('x')
os.environ['LEAK'] = '1'
leaked = 1
subprocess.Popen(['sleep', '1000'], start_new_session=True)
print('left')
`, map[string]string{"LEAKED_ENV": "1"})
	res, second := runPooled(t, p, `
import os
found = [d for d in ('/workspace', '/tmp', '/dev/shm') if os.path.exists(d + '/leak')]
env = [k for k in ('LEAK', 'LEAKED_ENV') if k in os.environ]
sleeps = []
for pid in os.listdir('/proc'):
    if pid.isdigit():
        try:
            if b'sleep' in open('/proc/' + pid + '/cmdline', 'rb').read():
                sleeps.append(pid)
        except OSError:
            pass
print(found, env, 'leaked' in globals(), sleeps)
`, nil)
	if got := strings.TrimSpace(res.Stdout); got != "[] [] False []" {
		t.Errorf("the second one-shot found what the first left (files, environment, variable, processes): %s", got)
	}
	if first == second {
		t.Fatalf("both one-shots ran in sandbox %s", first)
	}
	if !slices.Contains(before, "vivarium-"+first) || !slices.Contains(before, "vivarium-"+second) {
		t.Errorf("one-shots in %s and %s, not in the sandboxes the pool held: %v", first, second, before)
	}
	if n := hits(p); n != 2 {
		t.Errorf("%d one-shots served from the pool, want 2", n)
	}
	for _, id := range []string{first, second} {
		if slices.Contains(containers(t, dir), "vivarium-"+id) {
			t.Errorf("the container of one-shot %s is left after its close", id)
		}
	}
}

// The pool refills after each one-shot; a ready sandbox that dies while
// it waits is discarded and replaced without a request, and never handed
// out; closing the pool and then the backend leaves no container, cgroup,
// mount, process or directory.
func TestPoolRefillsDiscardsTheDeadAndClosesClean(t *testing.T) {
	dir, cps := t.TempDir(), t.TempDir()
	b := pauseBackend(t, gvisor.Config{StateDir: dir, CheckpointDir: cps})
	p := poolOf(t, b, 2)
	defer p.Close()
	// What the ready sandboxes hold is reported (gVisor's kernel and
	// gofer are in each sandbox's cgroup, with the agent and the runner).
	if st := p.Stats(); st[0].MemoryBytes <= 0 {
		t.Errorf("the pool reports %d bytes for its two ready gVisor sandboxes", st[0].MemoryBytes)
	} else {
		t.Logf("two ready gVisor sandboxes: %.1f MiB PSS", float64(st[0].MemoryBytes)/(1<<20))
	}

	_, used := runPooled(t, p, "print(1)", nil)
	waitReady(t, p, 2)
	ready := containers(t, dir)
	if len(ready) != 2 || slices.Contains(ready, "vivarium-"+used) {
		t.Fatalf("after a one-shot from the pool: containers %v, want two new ones (not %s's)", ready, used)
	}

	// One of the ready sandboxes dies: its agent, the container's init,
	// is killed, as by the host's OOM killer or an operator.
	victim := ready[0]
	kill := exec.Command("runsc", "--root", filepath.Join(dir, "runsc"), "kill", victim, "KILL")
	if out, err := kill.CombinedOutput(); err != nil {
		t.Fatalf("runsc kill: %v: %s", err, out)
	}
	testutil.WaitFor(t, 2*time.Minute, "the dead sandbox to be replaced", func() bool {
		c := containers(t, dir)
		return len(c) == 2 && !slices.Contains(c, victim)
	})
	waitReady(t, p, 2)
	for range 2 {
		_, id := runPooled(t, p, "print(1)", nil)
		if "vivarium-"+id == victim {
			t.Fatal("the pool handed out the sandbox that died")
		}
	}

	// A creation may be under way: Close waits for it and closes what it
	// made.
	if err := p.Close(); err != nil {
		t.Errorf("the pool's Close: %v", err)
	}
	requireNothingLeft(t, b, dir, cps)
}
