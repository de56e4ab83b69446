package main

import (
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// A user pauses a sandbox (the server's default kind, forked from its
// zygote) that holds a file open on a volume; the server keeps it on disk
// and is killed (SIGKILL). The volume cannot be deleted while the
// sandbox is paused, before the restart or after it; resumed after the
// restart, the sandbox has its variables and its file, at its offset.
func TestServePausedVolumeSurvivesRestart(t *testing.T) {
	needSandbox(t)
	if _, err := criu.Usable(); err != nil {
		t.Skipf("pausing needs CRIU, not built here (make criu): %v", err)
	}
	dataDir := t.TempDir()
	awaitUnmounted(t, dataDir)
	key, _ := createKey(t, dataDir, "alice")
	flags := []string{"--volume-size", "32MiB", "--pool", "0"}
	srv := startServer(t, dataDir, flags...)
	run := func(want int, args ...string) string {
		t.Helper()
		r := srv.cliAs(t, key, "", args...)
		if r.code != want {
			t.Fatalf("vivarium %s: exit %d, want %d\n%s%s", strings.Join(args, " "), r.code, want, r.stdout, r.stderr)
		}
		return strings.TrimSpace(r.stdout + r.stderr)
	}
	run(0, "volume", "create", "data")
	id := run(0, "sandbox", "create", "--volume", "data:/home/user/data")
	run(0, "sandbox", "exec", id, "-c", "x = 41\nf = open('/home/user/data/held.txt', 'w+')\nf.write('abc')\nf.flush()")
	run(0, "sandbox", "pause", id)
	testutil.WaitFor(t, 30*time.Second, "the paused sandbox to be kept on disk", func() bool {
		return strings.Contains(srv.log.String(), "paused sandbox kept on disk")
	})
	if out := run(1, "volume", "rm", "data"); !strings.Contains(out, "running or paused") {
		t.Fatalf("the deletion of a paused sandbox's volume: %s", out)
	}
	srv.cmd.Process.Kill()
	<-srv.exited

	srv = startServer(t, dataDir, flags...)
	if out := run(0, "sandbox", "list"); !strings.Contains(out, id) || !strings.Contains(out, "paused") {
		t.Fatalf("after a restart the sandbox is listed as:\n%s", out)
	}
	if out := run(1, "volume", "rm", "data"); !strings.Contains(out, "running or paused") {
		t.Fatalf("after a restart, the deletion of the paused sandbox's volume: %s", out)
	}
	run(0, "sandbox", "resume", id)
	if out := run(0, "sandbox", "exec", id, "-c", "f.write('d')\nf.flush()\nprint(x + 1, f.tell(), open('/workspace/data/held.txt').read())"); out != "42 4 abcd" {
		t.Fatalf("resumed after a restart: %q", out)
	}
	run(0, "sandbox", "kill", id)
	run(0, "volume", "rm", "data")
}
