package runner

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
)

// A template without python3 (and a native build's sandbox, which runs
// commands only) still has a runner, as every sandbox does: the sandbox's
// init or agent program again (/proc/self/exe), with argv[0]
// NoPythonArg0, speaking the runner's protocol (runner.py's
// Channel: frames of a 4-byte big-endian length and a JSON object, requests
// on descriptor 3, events on 4). It says it is ready, and answers every
// execution with an error that says why no code runs; commands run as in
// every sandbox.
const NoPythonArg0 = "vivarium-no-python"

// The runner without Python takes over its process before main: any
// program that imports this package (vivarium, the init program, the
// agent, a test binary) can be it.
func init() {
	if len(os.Args) > 1 && os.Args[0] == NoPythonArg0 {
		os.Exit(ServeNoPython(os.Args[1] == "--oneshot"))
	}
}

// NoPythonMessage is what an execution in such a sandbox answers.
const NoPythonMessage = "this sandbox's template has no python3 on its PATH: it runs commands, not code " +
	"(install Python in the template, or run the code with a command)"

// maxNoPythonFrame bounds one request read (an execution's code).
const maxNoPythonFrame = 64 << 20

// ServeNoPython is the runner of a sandbox without Python; it returns the
// exit status.
func ServeNoPython(oneShot bool) int {
	req, evt := os.NewFile(3, "requests"), os.NewFile(4, "events")
	send := func(ev map[string]any) error {
		b, _ := json.Marshal(ev)
		frame := binary.BigEndian.AppendUint32(nil, uint32(len(b)))
		_, err := evt.Write(append(frame, b...))
		return err
	}
	if send(map[string]any{"type": "ready"}) != nil {
		return 1
	}
	var head [4]byte
	for {
		if _, err := io.ReadFull(req, head[:]); err != nil {
			return 0
		}
		n := binary.BigEndian.Uint32(head[:])
		if n > maxNoPythonFrame {
			return 1
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(req, body); err != nil {
			return 0
		}
		var r struct{ Type string }
		if json.Unmarshal(body, &r) != nil || r.Type != "execute" {
			continue
		}
		if send(map[string]any{"type": "error", "name": "NoPython", "value": NoPythonMessage, "traceback": ""}) != nil ||
			send(map[string]any{"type": "done", "exit_code": 1}) != nil {
			return 1
		}
		if oneShot {
			return 1
		}
	}
}
