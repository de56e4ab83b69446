package wasm

import (
	"errors"
	"fmt"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// ErrNotBuilt: the interpreter (python.wasm and its standard library) is
// not where the backend looks for it. The text says where it looked and
// that `make wasm` builds it.
var ErrNotBuilt = fmt.Errorf("%w: the wasm interpreter is not built", sandbox.ErrUnsupported)

// errInstanceEnded: the interpreter instance is gone (it exited, crashed
// or was stopped).
var errInstanceEnded = errors.New("the interpreter has ended")

// errNoInterrupt is what Interrupt answers while code runs: WebAssembly
// has no signals, and the guest polls nothing the host could set.
var errNoInterrupt = fmt.Errorf("%w: the wasm backend cannot interrupt running code; "+
	"its time limit ends it (and restarts the interpreter)", sandbox.ErrUnsupported)

// errNoTerminals is what Start answers for a command with a terminal.
var errNoTerminals = fmt.Errorf("%w: the wasm backend has no terminals (pseudo-terminals): "+
	"a wasm sandbox is one Python interpreter, with no shell or processes", sandbox.ErrUnsupported)

// errNoCommands is what Start answers: a wasm sandbox has no processes.
var errNoCommands = fmt.Errorf("%w: the wasm backend cannot run commands: "+
	"a wasm sandbox is one Python interpreter, with no shell or processes", sandbox.ErrUnsupported)
