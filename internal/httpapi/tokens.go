package httpapi

import (
	"fmt"
	"net/http"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Revoker is an Authenticator whose keys their holders may revoke
// (POST /v1/key/revoke): a server's own keys. A cluster's are its
// Secrets, revoked by whoever manages them.
type Revoker interface {
	Revoke(id string, closeSandboxes bool) error
}

type (
	revokeRequest struct {
		CloseSandboxes bool `json:"close_sandboxes" doc:"close the key's sandboxes too; otherwise they run on, unreachable, until their timeout"`
	}
	revokeResponse struct {
		Revoked         string `json:"revoked" doc:"the key's id"`
		SandboxesClosed int    `json:"sandboxes_closed"`
	}
	accessToken struct {
		Token string `json:"token" doc:"the sandbox's new E2B access token (envdAccessToken and trafficAccessToken); E2B's Sandbox.connect returns it too"`
	}
	portTokenRequest struct {
		Rotate bool `json:"rotate" doc:"give the port a new token: the old one, and links and cookies made with it, open nothing from now on"`
	}
)

// revokeKey revokes the caller's own key: a holder who fears it leaked
// need not wait for an operator.
func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request) {
	var req revokeRequest
	if !decode(w, r, &req) {
		return
	}
	rv, ok := s.auth.(Revoker)
	if s.auth == nil || !ok {
		what := "this server has no keys (--dev)"
		if s.auth != nil {
			what = "a cluster's keys are its Secrets: revoke one with vivarium keys revoke --cluster"
		}
		s.fail(w, fmt.Errorf("%w: %s", sandbox.ErrUnsupported, what))
		return
	}
	who := owner(r)
	if err := rv.Revoke(who, req.CloseSandboxes); err != nil {
		s.fail(w, err)
		return
	}
	closed := 0
	if req.CloseSandboxes {
		closed = s.svc.CloseOwner(who)
	}
	s.log.Info("key revoked by its holder", "key", who, "sandboxes_closed", closed)
	writeJSON(w, http.StatusOK, revokeResponse{Revoked: who, SandboxesClosed: closed})
}

// rotateAccessToken gives a sandbox a new E2B access token.
func (s *Server) rotateAccessToken(w http.ResponseWriter, r *http.Request) {
	tok, err := s.svc.RotateAccessToken(owner(r), r.PathValue("id"))
	s.respond(w, accessToken{Token: tok}, err)
}
