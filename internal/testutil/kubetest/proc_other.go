//go:build !linux

package kubetest

import "os/exec"

// detach: only Linux has a parent-death signal; elsewhere t.Cleanup alone
// stops the children.
func detach(cmd *exec.Cmd) {}
