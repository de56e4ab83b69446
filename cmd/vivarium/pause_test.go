package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// A user pauses a sandbox of a server with its defaults and resumes it,
// by hand, through the CLI: its variables come back; while paused, a call says so; a
// sandbox made with --auto-resume is resumed by the next call.
func TestServePauseResume(t *testing.T) {
	needSandbox(t)
	if _, err := criu.Usable(); err != nil {
		t.Skipf("pausing needs CRIU, not built here (make criu): %v", err)
	}
	// The server's defaults: its sandboxes are forked from the zygote,
	// from its pool.
	srv := startServer(t, t.TempDir(), "--dev")
	run := func(want int, args ...string) string { t.Helper(); return srv.run(t, want, args...) }
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
	// A paused sandbox is copied too, and stays paused.
	run(0, "sandbox", "pause", id)
	ofPaused := run(0, "sandbox", "fork", id)
	if out := run(0, "sandbox", "exec", ofPaused, "-c", "print(x)"); out != "41" {
		t.Fatalf("a copy of the paused sandbox: %q", out)
	}
	if out := run(1, "sandbox", "exec", id, "-c", "x"); !strings.Contains(out, "paused") {
		t.Fatalf("the source after a copy of it paused: %s", out)
	}
	run(0, "sandbox", "kill", ofPaused)
	run(0, "sandbox", "resume", id)

	auto := run(0, "sandbox", "create", "--auto-resume")
	run(0, "sandbox", "exec", auto, "-c", "y = 'kept'")
	run(0, "sandbox", "pause", auto)
	if out := run(0, "sandbox", "exec", auto, "-c", "print(y)"); out != "kept" {
		t.Fatalf("an auto-resumed sandbox: %q", out)
	}
	run(0, "sandbox", "kill", id, auto)
	log := srv.log.String()
	if strings.Count(log, "sandbox paused") != 4 || strings.Count(log, "sandbox resumed") != 4 {
		t.Fatalf("the server's log tells of other pauses and resumes:\n%s", log)
	}
	t.Logf("server log:\n%s", log)
}

// A user saves a sandbox as a snapshot, the server is killed (SIGKILL)
// and started again, and a new sandbox made from the snapshot has every
// variable and file; the snapshot exported and imported again is a
// snapshot of its own; a server with another snapshot key, and a changed
// archive, are refused; a deleted snapshot is gone.
func TestServeSnapshots(t *testing.T) {
	needSandbox(t)
	if _, err := criu.Usable(); err != nil {
		t.Skipf("snapshots need CRIU, not built here (make criu): %v", err)
	}
	dataDir := t.TempDir()
	srv := startServer(t, dataDir, "--dev", "--pool", "0")
	// A sandbox of the zygote, as every one of a server with its defaults.
	id := srv.run(t, 0, "sandbox", "create")
	srv.run(t, 0, "sandbox", "exec", id, "-c", "import json\nx = 41\nopen('f.txt', 'w').write('kept')")
	snap := srv.run(t, 0, "sandbox", "snapshot", id, "--name", "counted")
	if !strings.HasPrefix(snap, "snap_") {
		t.Fatalf("snapshot printed %q", snap)
	}
	// The source goes on.
	if out := srv.run(t, 0, "sandbox", "exec", id, "-c", "x += 1\nprint(x)"); out != "42" {
		t.Fatalf("the source after its snapshot: %q", out)
	}
	// A paused sandbox is saved too, and stays paused.
	srv.run(t, 0, "sandbox", "pause", id)
	pausedSnap := srv.run(t, 0, "sandbox", "snapshot", id)
	if out := srv.run(t, 0, "sandbox", "list"); !strings.Contains(out, "paused") {
		t.Fatalf("the source after a snapshot of it paused:\n%s", out)
	}
	ofPaused := srv.run(t, 0, "sandbox", "create", "--from-snapshot", pausedSnap)
	if out := srv.run(t, 0, "sandbox", "exec", ofPaused, "-c", "print(x)"); out != "42" {
		t.Fatalf("a sandbox of the paused sandbox's snapshot: %q", out)
	}
	srv.run(t, 0, "sandbox", "kill", ofPaused)
	srv.run(t, 0, "sandbox", "snapshot-rm", pausedSnap)
	srv.run(t, 0, "sandbox", "resume", id)
	archive := filepath.Join(t.TempDir(), "snap.tar")
	srv.run(t, 0, "sandbox", "snapshot-export", snap, archive)

	srv.cmd.Process.Kill()
	<-srv.exited
	srv = startServer(t, dataDir, "--dev", "--pool", "0")
	if out := srv.run(t, 0, "sandbox", "snapshots"); !strings.Contains(out, snap) || !strings.Contains(out, "counted") {
		t.Fatalf("the snapshots after a restart:\n%s", out)
	}
	fresh := srv.run(t, 0, "sandbox", "create", "--from-snapshot", "counted") // by its name
	if out := srv.run(t, 0, "sandbox", "exec", fresh, "-c", "print(x + 1, json.dumps(open('f.txt').read()))"); out != `42 "kept"` {
		t.Fatalf("a sandbox made from the snapshot after a restart: %q", out)
	}

	imported := srv.run(t, 0, "sandbox", "snapshot-import", archive)
	if imported == snap || !strings.HasPrefix(imported, "snap_") {
		t.Fatalf("import printed %q", imported)
	}
	again := srv.run(t, 0, "sandbox", "create", "--from-snapshot", imported)
	if out := srv.run(t, 0, "sandbox", "exec", again, "-c", "print(x)"); out != "41" {
		t.Fatalf("a sandbox of the imported snapshot: %q", out)
	}
	// A changed archive: one byte of its contents.
	b, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x55
	changed := filepath.Join(t.TempDir(), "changed.tar")
	os.WriteFile(changed, b, 0o600)
	if out := srv.run(t, 1, "sandbox", "snapshot-import", changed); !strings.Contains(out, "changed") && !strings.Contains(out, "archive") {
		t.Fatalf("a changed archive: %s", out)
	}
	// Another server: another key.
	other := startServer(t, t.TempDir(), "--dev", "--pool", "0", "--cgroup-parent", serveParent+"-other")
	if out := other.run(t, 1, "sandbox", "snapshot-import", archive); !strings.Contains(out, "not made by this server") {
		t.Fatalf("an archive of another server's: %s", out)
	}
	srv.run(t, 0, "sandbox", "snapshot-rm", imported)
	if out := srv.run(t, 0, "sandbox", "snapshots"); strings.Contains(out, imported) || !strings.Contains(out, snap) {
		t.Fatalf("the snapshots after a delete:\n%s", out)
	}
	srv.run(t, 3, "sandbox", "create", "--from-snapshot", imported)
	srv.run(t, 0, "sandbox", "kill", fresh, again)
}

// The promise: a user pauses a sandbox holding state, the server
// is killed (SIGKILL) and started again, and the sandbox is listed,
// paused, under its id; resumed, every variable and file is there.
func TestServePausedSurvivesRestart(t *testing.T) {
	needSandbox(t)
	if _, err := criu.Usable(); err != nil {
		t.Skipf("pausing needs CRIU, not built here (make criu): %v", err)
	}
	dataDir := t.TempDir()
	srv := startServer(t, dataDir, "--dev", "--pool", "0")
	id := srv.run(t, 0, "sandbox", "create")
	srv.run(t, 0, "sandbox", "exec", id, "-c", "import json, pandas as pd\nx = 41\ndf = pd.DataFrame({'a': [1, 2]})\nopen('f.txt', 'w').write('kept')")
	srv.run(t, 0, "sandbox", "pause", id)
	testutil.WaitFor(t, 30*time.Second, "the paused sandbox to be kept on disk", func() bool {
		return strings.Contains(srv.log.String(), "paused sandbox kept on disk")
	})
	srv.cmd.Process.Kill()
	<-srv.exited

	srv = startServer(t, dataDir, "--dev", "--pool", "0")
	if out := srv.run(t, 0, "sandbox", "list"); !strings.Contains(out, id) || !strings.Contains(out, "paused") {
		t.Fatalf("after a restart the sandbox is listed as:\n%s", out)
	}
	if out := srv.run(t, 1, "sandbox", "exec", id, "-c", "x"); !strings.Contains(out, "paused") {
		t.Fatalf("an execution in the paused sandbox after a restart: %s", out)
	}
	srv.run(t, 0, "sandbox", "resume", id)
	if out := srv.run(t, 0, "sandbox", "exec", id, "-c", "print(x + 1, int(df.a.sum()), json.dumps(open('f.txt').read()))"); out != `42 3 "kept"` {
		t.Fatalf("resumed after a restart: %q", out)
	}
	if kept, _ := filepath.Glob(filepath.Join(dataDir, "paused", "sb_*")); len(kept) != 0 {
		t.Fatalf("a resumed sandbox is still kept on disk: %v", kept)
	}
	// Paused again, kept, resumed, paused and deleted: nothing is kept.
	srv.run(t, 0, "sandbox", "pause", id)
	testutil.WaitFor(t, 30*time.Second, "the paused sandbox to be kept on disk again", func() bool {
		return strings.Count(srv.log.String(), "paused sandbox kept on disk") == 1
	})
	// Kept on disk, it held nothing else any more (released): its resume
	// reads the kept copy.
	if !strings.Contains(srv.log.String(), "released=true") {
		t.Fatalf("the sandbox kept on disk was not released:\n%s", srv.log.String())
	}
	srv.run(t, 0, "sandbox", "resume", id)
	if out := srv.run(t, 0, "sandbox", "exec", id, "-c", "print(x + 1, int(df.a.sum()))"); out != "42 3" {
		t.Fatalf("resumed after its release: %q", out)
	}
	srv.run(t, 0, "sandbox", "pause", id)
	testutil.WaitFor(t, 30*time.Second, "the paused sandbox to be kept on disk a third time", func() bool {
		return strings.Count(srv.log.String(), "paused sandbox kept on disk") == 2
	})
	srv.run(t, 0, "sandbox", "kill", id)
	if kept, _ := filepath.Glob(filepath.Join(dataDir, "paused", "sb_*")); len(kept) != 0 {
		t.Fatalf("a deleted sandbox is still kept on disk: %v", kept)
	}
}

// run runs a vivarium subcommand as a client of s without a key (a --dev
// server), fails the test unless it exits with want, and returns its
// output, stdout then stderr, trimmed.
func (s *server) run(t *testing.T, want int, args ...string) string {
	t.Helper()
	r := s.cliAs(t, "", "", args...)
	if r.code != want {
		t.Fatalf("vivarium %s: exit %d, want %d\n%s%s", strings.Join(args, " "), r.code, want, r.stdout, r.stderr)
	}
	return strings.TrimSpace(r.stdout + r.stderr)
}

// TestServePauseOnShutdown: a server with --pause-on-shutdown, stopped with
// SIGTERM (a rolling update), pauses its sandbox and keeps it; the next
// server on the data directory has it, paused, and resumes it with its
// state. A sandbox that cannot be paused now (a TCP connection open in it)
// is closed as ever.
func TestServePauseOnShutdown(t *testing.T) {
	needSandbox(t)
	if _, err := criu.Usable(); err != nil {
		t.Skipf("pausing needs CRIU, not built here (make criu): %v", err)
	}
	dataDir := t.TempDir()
	srv := startServer(t, dataDir, "--dev", "--pool", "0", "--pause-on-shutdown")
	id := srv.run(t, 0, "sandbox", "create")
	plain := srv.run(t, 0, "sandbox", "create")
	srv.run(t, 0, "sandbox", "exec", id, "-c", "import pandas as pd\nx = 41\ndf = pd.DataFrame({'a': [1, 2]})")
	srv.run(t, 0, "sandbox", "exec", plain, "-c", "import socket\nsrv = socket.socket()\nsrv.bind(('127.0.0.1', 0))\n"+
		"srv.listen()\nc = socket.create_connection(srv.getsockname())\na, _ = srv.accept()")
	srv.cmd.Process.Signal(syscall.SIGTERM)
	<-srv.exited
	if !strings.Contains(srv.log.String(), "shutdown: sandboxes paused to be kept") {
		t.Fatalf("the shutdown paused nothing:\n%s", srv.log.String())
	}

	srv = startServer(t, dataDir, "--dev", "--pool", "0")
	out := srv.run(t, 0, "sandbox", "list")
	if !strings.Contains(out, id) || !strings.Contains(out, "paused") || strings.Contains(out, plain) {
		t.Fatalf("after a restart the sandboxes are listed as:\n%s", out)
	}
	srv.run(t, 0, "sandbox", "resume", id)
	if got := srv.run(t, 0, "sandbox", "exec", id, "-c", "print(x + 1, int(df.a.sum()))"); got != "42 3" {
		t.Fatalf("resumed after a rolling restart: %q", got)
	}
}
