package native

import (
	"bufio"
	"os/exec"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// threadsOf counts a process's threads: the main one and four.
func TestThreadsOf(t *testing.T) {
	py := testutil.RequirePython(t)
	cmd := exec.Command(py, "-c", `
import sys, threading, time
for _ in range(4):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
`)
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		cmd.Wait()
	}()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("helper: %q, %v", line, err)
	}
	if n, err := threadsOf(cmd.Process.Pid); err != nil || n != 5 {
		t.Fatalf("threadsOf = %d, %v; want 5 (the main thread and four)", n, err)
	}
	if _, err := threadsOf(1 << 30); err == nil {
		t.Fatal("threadsOf of no process: no error")
	}
}
