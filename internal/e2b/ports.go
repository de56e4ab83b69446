package e2b

// A sandbox's ports, as E2B's SDKs reach them: getHost(port) names
// <port>-<id>.<domain>, and the request carries the sandbox's
// trafficAccessToken in the E2B-Traffic-Access-Token header (E2B asks for
// it only of sandboxes created with allowPublicTraffic false; here it is
// always needed: a sandbox's ports are never public). The host form is
// served in front of every API (package portproxy, wired by vivarium
// serve); the adapter tells whose token it is and which domain the
// control plane reports, so that getHost builds the server's hosts.

// TrafficTokenOwner returns the owner an E2B traffic access token was
// made for, if it opens sandbox id. Like E2B's, it opens every port of
// that sandbox.
func (s *Server) TrafficTokenOwner(token, id string) (string, bool) {
	owner, ok, _ := s.svc.AccessTokenOwner(token, id)
	return owner, ok
}

// domain is what the control plane reports as a sandbox's domain (E2B's
// "domain"): the server's preview domain, nil without one.
func (s *Server) domain() *string {
	if s.cfg.Domain == "" {
		return nil
	}
	d := s.cfg.Domain
	return &d
}
