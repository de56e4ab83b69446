package main

import (
	"log/slog"
	"net/http"

	"github.com/vivarium-sandbox/vivarium/internal/e2b"
	"github.com/vivarium-sandbox/vivarium/internal/httpapi"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// e2bPrefix is where `vivarium serve` answers E2B's SDKs.
const e2bPrefix = e2b.Prefix

// withE2B serves E2B's API at /e2b beside the rest, behind the same keys.
// behindGateway: every request comes through a cluster's gateway, which
// names its client in X-Forwarded-For.
func withE2B(next http.Handler, svc *service.Service, auth httpapi.Authenticator, log *slog.Logger, domain string, pausable,
	behindGateway bool) (http.Handler, *e2b.Server) {
	var a e2b.Authenticator
	if auth != nil {
		a = auth
	}
	h := e2b.New(e2b.Config{Service: svc, Auth: a, DevOwner: httpapi.DevOwner, Logger: log, Prefix: e2bPrefix, Domain: domain,
		Pausable: pausable, ForwardedFor: behindGateway})
	mux := http.NewServeMux()
	mux.Handle(e2bPrefix+"/", h)
	// Signed file URLs: E2B's SDKs build them at the root of the sandbox
	// URL's host, whatever its path.
	mux.Handle(e2b.SignedFilesPath, h.SignedFiles())
	mux.Handle("/", next)
	return mux, h
}
