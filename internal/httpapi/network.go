package httpapi

import (
	"net/http"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

type packageRequest struct {
	Name    string `json:"name" doc:"a package on the server's allowlist"`
	Version string `json:"version,omitempty" doc:"an allowed version; default: the newest the server's index has"`
}

// installPackage installs an allowed package into one sandbox. pip's
// failure is a result (status "error", with pip's output), not an HTTP
// error; a package or sandbox the server does not allow is a 403.
func (s *Server) installPackage(w http.ResponseWriter, r *http.Request) {
	var req packageRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Name == "" {
		writeError(w, apierr.InvalidRequest, "name is required: the package to install")
		return
	}
	res, err := s.svc.InstallPackage(r.Context(), owner(r), r.PathValue("id"), service.PackageRequest{Name: req.Name, Version: req.Version})
	s.respond(w, res, err)
}

// setNetwork replaces what a running sandbox may reach: the body is the
// create request's "network" (allow, all, deny, except), granted anew
// within the server's allowlist and applied to the sandbox's connections
// at once (service.UpdateNetwork).
func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request) {
	var req netpolicy.Request
	if !decode(w, r, &req) {
		return
	}
	info, err := s.svc.UpdateNetwork(owner(r), r.PathValue("id"), req)
	s.respond(w, info, err)
}
