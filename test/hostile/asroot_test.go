//go:build linux

package hostile

import (
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"strings"
	"sync"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Root of a sandbox (sandbox.UserRoot: uid 0 of the sandbox's own user
// namespace, what E2B's `user: 'root'` commands run as) owns the sandbox's
// own disk and nothing more. The cases about the host, its secrets,
// privilege, the kernel's interfaces and what a sandbox may observe run
// again, each twice, as commands (python3 -c): once as the sandbox user,
// once as its root. Every attempt a case prints ("label outcome") must end
// for root no better than for the user, except where the label names the
// sandbox's own disk (rootOwns); the canaries, host state and leftover
// checks of TestHostile cover both runs.

// rootCaseGroups are the groups whose cases print one line per attempt.
var rootCaseGroups = [][]hostileCase{secretCases, filesystemCases, procCases, privilegeCases, seccompCases,
	observeCases, budgetCases}

// rootOwns names attempts that may succeed for root and not for the user,
// because they touch only what root owns inside the sandbox, with why.
var rootOwns = map[string]string{
	"become_root: setuid 0":                           "it is uid 0 already",
	"become_root: seteuid 0":                          "it is uid 0 already",
	"become_root: setresuid 0":                        "it is uid 0 already",
	"become_root: setgid 0":                           "it is gid 0 already",
	"write_read_only_root: append /etc/passwd":        ownDisk,
	"write_read_only_root: rename /etc/passwd":        ownDisk,
	"write_read_only_root: unlink /etc/hosts":         ownDisk,
	"write_read_only_root: mkdir /evil":               ownDisk,
	"write_read_only_root: write /var/evil":           ownDisk,
	"link_to_host_files: hard link passwd into tmp":   ownDisk + " (/etc/passwd is the sandbox's copy)",
	"change_host_file_metadata: chmod workspace root": "it changes the mode of /, the sandbox's disk",
	// Its own sandbox's init: uid 0 of the same user namespace. Init is
	// not dumpable, so its memory, environment and descriptors stay
	// closed (the other attempts of proc_1_tricks); what root can do
	// to it harms only its own sandbox (root_kills_init).
	"proc_1_tricks: fd":            "lists init's descriptor numbers; opening one needs ptrace access, refused",
	"proc_1_tricks: oom_score_adj": "raises its own sandbox's init's OOM score: the sandbox's own cgroup is the only scope",
	"raise_rlimits: prlimit init":  "may lower its own sandbox's init's limits; raising a hard limit needs CAP_SYS_RESOURCE",
}

const ownDisk = "the sandbox's disk is its root's"

// runAsRoot runs every case of rootCaseGroups as the sandbox user and as
// its root on be, and compares them.
func (h *harness) runAsRoot(t *testing.T) {
	t.Run("root_signals_init", h.rootSignalsInit)
	for _, group := range rootCaseGroups {
		for _, c := range group {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				h.compareAsRoot(t, c)
			})
		}
	}
}

func (h *harness) compareAsRoot(t *testing.T, c hostileCase) {
	j := &job{OneShot: sandbox.OneShot{Spec: sandbox.Spec{Limits: override(baseLimits, c.limits)}}, vars: map[string]string{}}
	if c.prepare != nil {
		c.prepare(t, h, j)
	}
	if j.OutDir != "" {
		t.Skip("the case needs a one-shot run's out directory")
	}
	if h.be.Allowlist && j.Spec.Egress == nil {
		j.Spec.Egress = h.egress.proxy(t)
	}
	env := maps.Clone(j.Request.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, j.vars)
	j.Spec.Root = h.be.Root
	var user, root, buildRoot string
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); user = h.runCommand(t, j.Spec, c.code, env, sandbox.UserSandbox) }()
	go func() { defer wg.Done(); root = h.runCommand(t, j.Spec, c.code, env, sandbox.UserRoot) }()
	if h.be.Root != nil {
		wg.Add(1)
		go func() { defer wg.Done(); buildRoot = h.runBuildStep(t, j.Spec, c.code, env) }()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	userOK := attempts(user)
	compare := func(who, out string, owns ...map[string]string) {
		gained := 0
		for label, outcome := range attempts(out) {
			if outcome != "ok" || userOK[label] == "ok" {
				continue
			}
			if why, ok := declared(c.name+": "+label, owns); ok {
				t.Logf("%s may: %s: %s", who, label, why)
				continue
			}
			gained++
			t.Errorf("as %s %q succeeds, as the user it ends %q", who, label, userOK[label])
		}
		if gained > 0 {
			t.Logf("as the user:\n%s\nas %s:\n%s", user, who, out)
		}
	}
	if h.be.Root == nil {
		compare("root", root, rootOwns)
	} else {
		compare("root", root, rootOwns, templateRootOwns)
		compare("a build step's root", buildRoot, rootOwns, templateRootOwns, buildRootOwns)
	}
}

// declared is why the first of owns that names label lets it succeed.
func declared(label string, owns []map[string]string) (string, bool) {
	for _, m := range owns {
		if why, ok := m[label]; ok {
			return why, true
		}
	}
	return "", false
}

// buildRootOwns names attempts that may succeed for a build step's root
// (the capabilities of native.buildCapabilities in the step's own user
// namespace) and not for the user, with why: each acts on the step's own
// files and ids only.
var buildRootOwns = map[string]string{
	"become_root: setgroups [0]": "CAP_SETGID: gid 0 of its own namespace, which it has already",
}

// templateRootOwns names attempts that may succeed for root in a
// template's sandbox, whose every file is the image's, copied up into the
// sandbox's own writable layer when changed (the layers never change:
// TestTemplateRoot).
var templateRootOwns = map[string]string{
	"change_host_file_metadata: chmod su":        templateDisk,
	"change_host_file_metadata: setxattr":        templateDisk,
	"change_host_file_metadata: truncate os.py":  templateDisk,
	"change_host_file_metadata: utime python":    templateDisk,
	"write_read_only_root: create /usr/bin/evil": templateDisk,
}

const templateDisk = "the template's files are its root's, changed in the sandbox's own writable layer"

// runBuildStep runs code with python3 as the root of a template build's
// step (native.Backend.RunBuildStep) on the backend's template root, and
// returns what it printed; nothing of the step is kept.
func (h *harness) runBuildStep(t *testing.T, spec sandbox.Spec, code string, env map[string]string) string {
	t.Helper()
	nb, ok := h.be.B.(*native.Backend)
	if !ok {
		t.Errorf("the %s backend runs no build step", h.be.Name)
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), longLimit+grace)
	defer cancel()
	var kv []string
	for k, v := range spec.Env {
		kv = append(kv, k+"="+v)
	}
	for k, v := range env {
		kv = append(kv, k+"="+v)
	}
	var out bytes.Buffer // RunBuildStep serialises the writes, and returns after the last
	lim := spec.Limits
	lim.Timeout = longLimit
	err := nb.RunBuildStep(ctx, native.BuildStep{Layers: h.be.Root.Layers, Args: []string{"python3", "-c", code},
		Env: append(kv, "PATH=/usr/bin:/bin"), Limits: lim, Log: &out,
		Commit: func(string, uint32, uint32) error { return nil }})
	if ee := (*native.BuildExitError)(nil); err != nil && !errors.As(err, &ee) {
		t.Errorf("a build step: %v", err)
	}
	text := out.String()
	if h.canaries.LeakedIn(text) {
		t.Errorf("as a build step's root, the host's canary token reached the sandbox: it shows in its output")
	}
	return text
}

// runCommand runs code with python3 in a fresh sandbox of spec, as who,
// and returns its stdout; the sandbox is closed before it returns.
func (h *harness) runCommand(t *testing.T, spec sandbox.Spec, code string, env map[string]string, who string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), longLimit+grace)
	defer cancel()
	sb, err := h.be.B.Create(ctx, spec)
	if err != nil {
		t.Errorf("create (%s): %v", who, err)
		return ""
	}
	defer sb.Close()
	p, err := sb.Start(ctx, sandbox.Command{Argv: []string{"python3", "-c", code}, Env: env, User: who})
	if err != nil {
		t.Errorf("start as %s: %v", who, err)
		return ""
	}
	p.Stdin().Close()
	var out, errOut bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		io.Copy(&out, io.LimitReader(p.Stdout(), 1<<20))
		io.Copy(io.Discard, p.Stdout())
	}()
	go func() {
		defer wg.Done()
		io.Copy(&errOut, io.LimitReader(p.Stderr(), 64<<10))
		io.Copy(io.Discard, p.Stderr())
	}()
	select {
	case <-p.Done():
	case <-ctx.Done():
		t.Errorf("as %s: still running after %v", who, longLimit+grace)
	}
	sb.Close() // ends the pipes of whatever the code left running
	wg.Wait()
	for where, text := range map[string]string{"stdout": out.String(), "stderr": errOut.String()} {
		if h.canaries.LeakedIn(text) {
			t.Errorf("as %s, the host's canary token reached the sandbox: it shows in %s", who, where)
		}
	}
	return out.String()
}

// attempts reads the "label outcome" lines that the probes print: the
// outcome is the last word. Lines of other shapes are ignored.
func attempts(stdout string) map[string]string {
	out := map[string]string{}
	for _, l := range strings.Split(stdout, "\n") {
		i := strings.LastIndexByte(l, ' ')
		if i <= 0 {
			continue
		}
		out[l[:i]] = l[i+1:]
	}
	return out
}

// rootSignalsInit: root may signal its sandbox's init (the same uid),
// and Go's default for most signals is to exit. Init drops them: after
// every catchable signal (and SIGKILL and SIGSTOP, which the kernel keeps
// from a namespace's init), the sandbox goes on.
func (h *harness) rootSignalsInit(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), longLimit+grace)
	defer cancel()
	sb, err := h.be.B.Create(ctx, sandbox.Spec{Limits: baseLimits})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	code := `import os, signal, time
sent = []
for s in range(1, 32):
    try:
        os.kill(1, s)
        sent.append(s)
    except OSError as e:
        print(s, e.strerror)
print("sent", len(sent))
time.sleep(0.2)
`
	p, err := sb.Start(ctx, sandbox.Command{Argv: []string{"python3", "-c", code}, User: sandbox.UserRoot})
	if err != nil {
		t.Fatal(err)
	}
	p.Stdin().Close()
	out, _ := io.ReadAll(io.LimitReader(p.Stdout(), 64<<10))
	select {
	case <-p.Done():
	case <-ctx.Done():
		t.Fatal("the command did not end")
	}
	if string(out) != "sent 31\n" || p.ExitCode() != 0 {
		t.Fatalf("as root, signalling init: exit %d, %q", p.ExitCode(), out)
	}
	res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "print('after')"}, nil)
	if err != nil || res.Status != sandbox.StatusOK || res.Stdout != "after\n" {
		t.Fatalf("after root signalled init, the sandbox answers %v %+v", err, res)
	}
}
