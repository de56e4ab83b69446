package main

import (
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/criu"
)

// A user pauses a sandbox and resumes it, by hand, through the CLI and
// the server: its variables come back; while paused, a call says so; a
// sandbox made with --auto-resume is resumed by the next call.
func TestServePauseResume(t *testing.T) {
	needSandbox(t)
	if _, err := criu.Usable(); err != nil {
		t.Skipf("pausing needs CRIU, not built here (make criu): %v", err)
	}
	// Sandboxes forked from a zygote cannot be paused yet: --zygote=false.
	srv := startServer(t, t.TempDir(), "--dev", "--pool", "0", "--zygote=false")
	run := func(want int, args ...string) string {
		t.Helper()
		r := srv.cliAs(t, "", "", args...)
		if r.code != want {
			t.Fatalf("vivarium %s: exit %d, want %d\n%s%s", strings.Join(args, " "), r.code, want, r.stdout, r.stderr)
		}
		return strings.TrimSpace(r.stdout + r.stderr)
	}
	id := run(0, "sandbox", "create")
	run(0, "sandbox", "exec", id, "-c", "import json\nx = 41")
	run(0, "sandbox", "pause", id)
	if out := run(0, "sandbox", "list"); !strings.Contains(out, id) || !strings.Contains(out, "paused") {
		t.Fatalf("a paused sandbox is listed as:\n%s", out)
	}
	if out := run(1, "sandbox", "exec", id, "-c", "x"); !strings.Contains(out, "paused") {
		t.Fatalf("an execution in a paused sandbox: %s", out)
	}
	if out := run(1, "sandbox", "pause", id); !strings.Contains(out, "already paused") {
		t.Fatalf("a second pause: %s", out)
	}
	run(0, "sandbox", "resume", id)
	if out := run(0, "sandbox", "exec", id, "-c", "print(x + 1, json.dumps([1]))"); out != "42 [1]" {
		t.Fatalf("after the resume: %q", out)
	}
	if out := run(1, "sandbox", "resume", id); !strings.Contains(out, "not paused") {
		t.Fatalf("a resume of a running sandbox: %s", out)
	}

	// Two copies of the running sandbox: its state, theirs apart.
	copies := strings.Fields(run(0, "sandbox", "fork", id, "--count", "2"))
	if len(copies) != 2 {
		t.Fatalf("fork printed %q", copies)
	}
	run(0, "sandbox", "exec", copies[0], "-c", "x = 0")
	if out := run(0, "sandbox", "exec", copies[1], "-c", "print(x)"); out != "41" {
		t.Fatalf("the second copy: %q", out)
	}
	if out := run(0, "sandbox", "exec", id, "-c", "print(x)"); out != "41" {
		t.Fatalf("the source after its copies changed theirs: %q", out)
	}
	run(0, append([]string{"sandbox", "kill"}, copies...)...)

	auto := run(0, "sandbox", "create", "--auto-resume")
	run(0, "sandbox", "exec", auto, "-c", "y = 'kept'")
	run(0, "sandbox", "pause", auto)
	if out := run(0, "sandbox", "exec", auto, "-c", "print(y)"); out != "kept" {
		t.Fatalf("an auto-resumed sandbox: %q", out)
	}
	run(0, "sandbox", "kill", id, auto)
	log := srv.log.String()
	if strings.Count(log, "sandbox paused") != 2 || strings.Count(log, "sandbox resumed") != 2 {
		t.Fatalf("the server's log tells of other pauses and resumes:\n%s", log)
	}
	t.Logf("server log:\n%s", log)
}
