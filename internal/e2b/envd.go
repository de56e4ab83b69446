package e2b

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// routeEnvd serves envd, the sandbox's agent: files over HTTP, the
// Filesystem and Process services over Connect.
func (s *Server) routeEnvd() {
	m := s.envd
	m.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	m.HandleFunc("GET /files", s.readFile)
	m.HandleFunc("POST /files", s.writeFiles)
	for name, h := range map[string]unaryMethod{
		"Stat":    s.stat,
		"MakeDir": s.makeDir,
		"Move":    s.move,
		"ListDir": s.listDir,
		"Remove":  s.remove,
	} {
		m.HandleFunc("POST /filesystem.Filesystem/"+name, func(w http.ResponseWriter, r *http.Request) { s.serveUnary(w, r, h) })
	}
	m.HandleFunc("POST /filesystem.Filesystem/WatchDir", func(w http.ResponseWriter, r *http.Request) { s.serveStream(w, r, s.watchDir) })
	for name, h := range map[string]unaryMethod{
		"CreateWatcher":    s.createWatcher,
		"GetWatcherEvents": s.watcherEvents,
		"RemoveWatcher":    s.removeWatcher,
	} {
		m.HandleFunc("POST /filesystem.Filesystem/"+name, func(w http.ResponseWriter, r *http.Request) { s.serveUnary(w, r, h) })
	}
	for name, h := range map[string]unaryMethod{
		"List":       s.listProcesses,
		"SendInput":  s.sendInput,
		"SendSignal": s.sendSignal,
		"CloseStdin": s.closeStdin,
		"Update":     s.updateProcess,
	} {
		m.HandleFunc("POST /process.Process/"+name, func(w http.ResponseWriter, r *http.Request) { s.serveUnary(w, r, h) })
	}
	m.HandleFunc("POST /process.Process/Start", func(w http.ResponseWriter, r *http.Request) { s.serveStream(w, r, s.startProcess) })
	m.HandleFunc("POST /process.Process/Connect", func(w http.ResponseWriter, r *http.Request) { s.serveStream(w, r, s.connectProcess) })
	m.HandleFunc("POST /process.Process/StreamInput", func(w http.ResponseWriter, r *http.Request) {
		s.writeRPCError(w, newConnectError(codeUnimplemented, "client streams are not supported; send input with SendInput"))
	})
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeEnvdError(w, http.StatusNotFound, fmt.Sprintf("%s %s is not part of vivarium's E2B-compatible sandbox API", r.Method, r.URL.Path))
	})
}

// checkUser maps the user an operation acts as: E2B's default user (the
// sandbox's own, also by Vivarium's name for it), or root, uid 0 of the
// sandbox's user namespace, which has no capability.
func checkUser(name string) (string, error) {
	switch name {
	case "", "user", "sandbox":
		return sandbox.UserSandbox, nil
	case "root":
		return sandbox.UserRoot, nil
	}
	return "", fmt.Errorf("%w %q: a sandbox has its user (\"user\") and its root (\"root\")", errUser, name)
}

// rpcUser is the user an RPC acts as: envd's HTTP Basic authorization
// carries it ("user:" in base64).
func rpcUser(r *http.Request) (string, error) {
	v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Basic ")
	if !ok {
		return sandbox.UserSandbox, nil
	}
	dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v))
	if err != nil {
		return "", newConnectError(codeInvalidArgument, "invalid Authorization header")
	}
	name, _, _ := strings.Cut(string(dec), ":")
	return checkUser(name)
}
