package main

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// TestVolumeSubcommandFlags runs each subcommand of `vivarium volume`
// against a recording server: a flag it takes reaches the request, one it
// does not take is refused before anything is sent.
func TestVolumeSubcommandFlags(t *testing.T) {
	testSubcommandFlags(t, volumeCmd, []subcommandCase{
		{"ls", []string{"--json"}, `GET /v1/volumes `, []string{"--size", "1GiB"}},
		{"create", []string{"data", "--size", "256MiB", "--json"}, `POST /v1/volumes {"name":"data","size":268435456}`, []string{"data", "--name", "n"}},
		{"info", []string{"data", "--json"}, `GET /v1/volumes/data `, []string{"data", "--size", "1GiB"}},
		{"rm", []string{"data"}, `DELETE /v1/volumes/data `, []string{"data", "--json"}},
	})
	// list is ls; a subcommand that names one volume wants exactly one.
	rec := &recorder{}
	hs := httptest.NewServer(rec)
	defer hs.Close()
	srv := &server{url: hs.URL, dataDir: t.TempDir()}
	if r := srv.cliAs(t, "", "", "volume", "list", "--size", "1GiB"); r.code != 2 || !strings.Contains(r.stderr, "ls takes no --size (create takes it)") {
		t.Errorf("list --size: exit status %d: %s", r.code, r.stderr)
	}
	for _, args := range [][]string{{"create"}, {"info", "a", "b"}, {"rm"}} {
		r := srv.cliAs(t, "", "", append([]string{"volume"}, args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, "want one volume NAME") {
			t.Errorf("%v: exit status %d: %s", args, r.code, r.stderr)
		}
	}
	if reqs := rec.take(); len(reqs) > 0 {
		t.Errorf("sent %q", reqs)
	}
}

// TestDocsVolumeFlags checks the table of `vivarium volume`'s flags in
// the docs against the flag sets.
func TestDocsVolumeFlags(t *testing.T) { testDocsSubcommandFlags(t, volumeCmd) }

// volumeLeftovers lists what of the volumes under dir is still mounted or
// attached to a loop device.
func volumeLeftovers(dir string) []string {
	var out []string
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, dir) {
			out = append(out, "mount: "+l)
		}
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), dir) {
			out = append(out, "loop: "+f)
		}
	}
	return out
}

// awaitUnmounted makes the test, as it ends, wait until nothing of
// dataDir (its volumes) is mounted here. After the last server is killed
// (a cleanup registered later, so run before this one), the processes of
// its sandboxes may still be ending and hold a volume's mount for a
// moment: the directory is removed once it is unmounted (never unmounted
// here). Call it right after making dataDir.
func awaitUnmounted(t *testing.T, dataDir string) {
	t.Cleanup(func() {
		testutil.WaitFor(t, 10*time.Second, "the volumes to be unmounted", func() bool {
			b, err := os.ReadFile("/proc/self/mountinfo")
			return err == nil && !strings.Contains(string(b), dataDir)
		})
	})
}

// A volume made with the CLI outlives its sandbox and the server; a
// stopped server leaves nothing of it mounted or attached.
func TestServeVolumes(t *testing.T) {
	needSandbox(t)
	dataDir := t.TempDir()
	awaitUnmounted(t, dataDir)
	key, _ := createKey(t, dataDir, "alice")
	flags := []string{"--volume-size", "32MiB", "--preload", "json", "--pool", "0"}
	srv := startServer(t, dataDir, flags...)
	must := func(r cli, what string) cli {
		t.Helper()
		if r.code != 0 {
			t.Fatalf("%s: exit %d\nstdout: %s\nstderr: %s", what, r.code, r.stdout, r.stderr)
		}
		return r
	}
	volID := strings.TrimSpace(must(srv.cliAs(t, key, "", "volume", "create", "data"), "volume create").stdout)
	if !strings.HasPrefix(volID, "vol_") {
		t.Fatalf("volume id %q", volID)
	}
	if r := srv.cliAs(t, key, "", "volume", "create", "../x"); r.code == 0 || !strings.Contains(r.stderr, "volume name") {
		t.Fatalf("bad name: %+v", r)
	}
	if ls := must(srv.cliAs(t, key, "", "volume", "ls"), "volume ls").stdout; !strings.Contains(ls, "data") ||
		!strings.Contains(ls, "32MiB") {
		t.Fatalf("ls: %s", ls)
	}
	id := strings.TrimSpace(must(srv.cliAs(t, key, "", "sandbox", "create", "--volume", "data:/home/user/data"), "create").stdout)
	must(srv.cliAs(t, key, "", "sandbox", "exec", id, "-c", `open("/home/user/data/kept.txt", "w").write("kept")`), "exec")
	if r := srv.cliAs(t, key, "", "volume", "rm", "data"); r.code == 0 || !strings.Contains(r.stderr, "mounted") {
		t.Fatalf("rm in use: %+v", r)
	}
	must(srv.cliAs(t, key, "", "sandbox", "kill", id), "kill")

	// Stop as an operator does; nothing of the volume is left mounted.
	srv.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-srv.exited:
	case <-time.After(60 * time.Second):
		t.Fatal("the server did not stop")
	}
	testutil.WaitFor(t, 10*time.Second, "nothing of the volume left after the server stopped",
		func() bool { return len(volumeLeftovers(dataDir)) == 0 })

	srv = startServer(t, dataDir, flags...)
	id = strings.TrimSpace(must(srv.cliAs(t, key, "", "sandbox", "create", "--volume", volID+":/mnt/v"), "create again").stdout)
	if out := must(srv.cliAs(t, key, "", "sandbox", "exec", id, "-c", `print(open("/mnt/v/kept.txt").read())`), "read").stdout; out != "kept\n" {
		t.Fatalf("after a restart: %q", out)
	}
	must(srv.cliAs(t, key, "", "sandbox", "kill", id), "kill")
	must(srv.cliAs(t, key, "", "volume", "rm", "data"), "volume rm")
	if ls := must(srv.cliAs(t, key, "", "volume", "ls"), "volume ls").stdout; strings.Contains(ls, "data") {
		t.Fatalf("ls after rm: %s", ls)
	}
}
