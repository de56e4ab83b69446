package main

import (
	"strings"
	"testing"
)

// `vivarium sandbox term` attaches to a terminal in the sandbox: what it
// reads is typed there, what the terminal shows comes back, and it exits
// with the command's status. (Raw mode and resizes need a terminal of
// its own: tried by hand under tmux.)
func TestSandboxTerm(t *testing.T) {
	needSandbox(t)
	dataDir := t.TempDir()
	key, _ := createKey(t, dataDir, "alice")
	srv := startServer(t, dataDir)
	r := srv.cliAs(t, key, "", "sandbox", "create")
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || id == "" {
		t.Fatalf("create: %d %s", r.code, r.stderr)
	}
	r = srv.cliAs(t, key, "tty; echo hi-$((1+1)); exit 3\n", "sandbox", "term", id)
	if r.code != 3 || !strings.Contains(r.stdout, "\r\nhi-2\r\n") || !strings.Contains(r.stdout, "/dev/pts/") {
		t.Fatalf("term: exit %d\nstdout: %q\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	// The command is one argument, a shell command, as sh's is.
	r = srv.cliAs(t, key, "", "sandbox", "term", id, "python3 -c 'import sys; print(sys.stdin.isatty(), sys.stdout.isatty())'")
	if r.code != 0 || !strings.Contains(r.stdout, "True True\r\n") {
		t.Fatalf("term with a command: exit %d\nstdout: %q\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	if r = srv.cliAs(t, key, "", "sandbox", "term", "sb_nosuch"); r.code != 3 {
		t.Fatalf("term in a missing sandbox: exit %d, stderr %s", r.code, r.stderr)
	}
}
