package e2b

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
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

// checkUser accepts the users every operation may act as: E2B's default
// user and the sandbox's own name, which are one unprivileged user.
func checkUser(name string) error {
	switch name {
	case "", "user", "sandbox":
		return nil
	}
	return fmt.Errorf("%w %q: vivarium runs everything as the sandbox's one unprivileged user (\"user\"); there is no root or other user",
		errUser, name)
}

// rpcUser is the user an RPC acts as: envd's HTTP Basic authorization
// carries it ("user:" in base64).
func rpcUser(r *http.Request) error {
	v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Basic ")
	if !ok {
		return nil
	}
	dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v))
	if err != nil {
		return newConnectError(codeInvalidArgument, "invalid Authorization header")
	}
	name, _, _ := strings.Cut(string(dec), ":")
	return checkUser(name)
}
