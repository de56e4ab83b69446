package kubetest

import (
	"os/exec"
	"syscall"
)

// detach makes the kernel kill the child when the test binary dies
// (a panic, `go test -timeout`), so that no etcd or kube-apiserver
// outlives it even where t.Cleanup never runs.
func detach(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
