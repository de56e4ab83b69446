package sandbox

import "sync/atomic"

// The program backends start inside their sandboxes: the native backend's
// init, the gvisor and docker backends' agent. A vivarium built by
// scripts/build.sh carries a small program of its own for it (cmd/vivarium's
// initprog.go), which main makes known here; otherwise, and in tests, a
// backend starts its own binary again (Config.Exe overrides both).
var program atomic.Pointer[func() string]

// SetProgram makes find the way to the program's path: called at most once
// per backend made, the first time one is; "" from it means none.
func SetProgram(find func() string) { program.Store(&find) }

// Program is the program's path, or "" when the backend is to start its
// own binary again.
func Program() string {
	if f := program.Load(); f != nil {
		return (*f)()
	}
	return ""
}

// ProgramDir is where the program is written out (cmd/vivarium), and
// where backends keep other files every sandbox starts with that are made
// once per host (the runner's compiled bytecode): a directory only root
// can write, which outlives any one server.
const ProgramDir = "/var/lib/vivarium/bin"
