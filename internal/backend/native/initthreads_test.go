package native

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

const spareHelperEnv = "VIVARIUM_SPARE_THREADS_HELPER"

// TestSpareThreads: a Go program with one P, as init is, whose pids limit
// was then set to the threads it has (as fitPids sets a sandbox's, which
// its code may fill), still has initSpareThreads goroutines in blocking
// system calls at once after spareThreads. Without it, the same program
// dies making a thread: init did so under a fork bomb on a loaded host,
// and took its sandbox with it.
func TestSpareThreads(t *testing.T) {
	testutil.RequireRoot(t)
	const parent = "vivarium-native-spare-test"
	mgr, err := cgroups.Detect(parent)
	if err != nil {
		t.Skipf("no cgroups here: %v", err)
	}
	t.Cleanup(func() {
		testutil.RemoveStaleCgroups(parent)
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + parent)
		for _, d := range append(dirs, "/sys/fs/cgroup/"+parent) {
			os.Remove(d)
		}
	})
	for _, spare := range []int{initSpareThreads, 0} {
		t.Run(fmt.Sprintf("spare=%d", spare), func(t *testing.T) {
			g, err := mgr.New(fmt.Sprintf("spare-%d", spare), cgroups.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			defer g.Destroy()
			ps, ok := g.(cgroups.PidsSetter)
			if !ok {
				t.Skip("the cgroup has no pids limit to set")
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestSpareThreadsHelper$")
			cmd.Env = append(os.Environ(), "GOMAXPROCS=1", "VIVARIUM_TEST_ONE_MODE=1",
				spareHelperEnv+"="+strconv.Itoa(spare))
			var stderr testutil.Buffer
			cmd.Stderr = &stderr
			in, _ := cmd.StdinPipe()
			outPipe, _ := cmd.StdoutPipe()
			out := bufio.NewReader(outPipe)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			if err := g.AddProc(cmd.Process.Pid); err != nil {
				t.Fatal(err)
			}
			step := func(say, want string) {
				t.Helper()
				fmt.Fprintln(in, say)
				line, err := out.ReadString('\n')
				if strings.TrimSpace(line) != want {
					cmd.Wait()
					t.Fatalf("after %q the helper said %q (%v), not %q; stderr:\n%.2000s", say, line, err, want, stderr.String())
				}
			}
			step("spare", "ready")
			tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", cmd.Process.Pid))
			if err != nil {
				t.Fatal(err)
			}
			if err := ps.SetPidsMax(len(tasks)); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintln(in, "block")
			line, _ := out.ReadString('\n')
			err = cmd.Wait()
			survived := strings.TrimSpace(line) == "survived" && err == nil
			switch {
			case spare > 0 && !survived:
				t.Errorf("with %d spare threads (%d in all), it did not survive: %q, %v; stderr:\n%.2000s",
					spare, len(tasks), line, err, stderr.String())
			case spare == 0 && survived:
				// The check above could not fail: the helper needed no
				// new thread to begin with.
				t.Errorf("without spare threads (%d in all), it survived", len(tasks))
			case spare == 0 && !strings.Contains(stderr.String(), "create"):
				// "runtime/cgo: pthread_create failed", or without cgo
				// "runtime: failed to create new OS thread".
				t.Errorf("without spare threads it failed, but not making a thread: %v; stderr:\n%.2000s", err, stderr.String())
			}
		})
	}
}

// TestSpareThreadsHelper is TestSpareThreads' program, run on its own.
func TestSpareThreadsHelper(t *testing.T) {
	spare, err := strconv.Atoi(os.Getenv(spareHelperEnv))
	if err != nil {
		t.Skip("run by TestSpareThreads")
	}
	in := bufio.NewReader(os.Stdin)
	in.ReadString('\n')
	if spare > 0 {
		spareThreads(spare)
	}
	fmt.Println("ready")
	in.ReadString('\n')
	var wg sync.WaitGroup
	for range initSpareThreads {
		wg.Go(func() {
			ts := unix.NsecToTimespec((200 * time.Millisecond).Nanoseconds())
			for unix.Nanosleep(&ts, &ts) == unix.EINTR {
			}
		})
	}
	wg.Wait()
	fmt.Println("survived")
	os.Exit(0)
}
