package e2b

import (
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// E2B's network settings over Vivarium's per-sandbox policy: E2B's
// "internet" is everything the server's operator allows (--allow-net),
// never more. In E2B's words, for the create options
// (allowInternetAccess, network.allowOut, network.denyOut) and
// PUT /sandboxes/{id}/network (updateNetwork):
//   - by default a sandbox reaches all the operator allows
//     (netpolicy.Request.All), on a backend that carries the proxy
//     (native); elsewhere nothing, and its info says
//     allowInternetAccess: false;
//   - denyOut is the sandbox's deny list; ALL_TRAFFIC (0.0.0.0/0) denies
//     IPv6 too, and allowInternetAccess: false is ALL_TRAFFIC denied;
//   - allowOut lifts denyOut for what it lists, as E2B's "allow takes
//     precedence over deny", and never adds to what the operator allows:
//     an entry outside the operator's list is refused by name (403);
//   - updateNetwork replaces the settings (omitted fields clear them),
//     applies to new connections at once, and closes the open ones the
//     new settings refuse.

// allTraffic is E2B's ALL_TRAFFIC.
const allTraffic = "0.0.0.0/0"

// networkBody is PUT /sandboxes/{id}/network's body (the SDKs' update
// body): the egress fields of create's network, and the internet switch
// under either of its spellings.
type networkBody struct {
	networkConfig
	AllowInternetAccess      *bool `json:"allow_internet_access"`
	AllowInternetAccessCamel *bool `json:"allowInternetAccess"`
}

// e2bRule turns one of E2B's allowOut/denyOut entries (an IP, a CIDR or
// a domain, IPv6 without brackets) into a rule of Vivarium's syntax.
func e2bRule(s string) string {
	s = strings.TrimSpace(s)
	if strings.Count(s, ":") > 1 && !strings.HasPrefix(s, "[") {
		return "[" + s + "]"
	}
	return s
}

// networkRequest translates E2B's network settings into the sandbox's
// request; nil settings and switch mean E2B's default, all the operator
// allows.
func networkRequest(internet *bool, nw *networkConfig) netpolicy.Request {
	req := netpolicy.Request{All: true}
	denyAll := internet != nil && !*internet
	if nw != nil {
		for _, d := range nw.DenyOut {
			if strings.TrimSpace(d) == allTraffic {
				denyAll = true
				continue
			}
			req.Deny = append(req.Deny, e2bRule(d))
		}
		for _, a := range nw.AllowOut {
			req.Except = append(req.Except, e2bRule(a))
		}
	}
	if denyAll {
		req.Deny = append([]string{allTraffic, "[::/0]"}, req.Deny...)
	}
	return req
}

// sandboxNetwork is E2B's SandboxNetworkConfig, as sandbox info reports it.
type sandboxNetwork struct {
	AllowOut        []string `json:"allowOut,omitempty"`
	DenyOut         []string `json:"denyOut,omitempty"`
	MaskRequestHost string   `json:"maskRequestHost,omitempty"`
	HTTPSPorts      []int    `json:"httpsPorts,omitempty"`
}

// e2bEntry turns a rule as Vivarium lists it ("1.1.1.1/32:*",
// "[::/0]:*") back into E2B's form ("1.1.1.1", "::/0").
func e2bEntry(rule string) string {
	s := strings.TrimSuffix(rule, ":*")
	s = strings.TrimPrefix(s, "[")
	s, _, _ = strings.Cut(s, "]")
	if p, err := netip.ParsePrefix(s); err == nil && p.IsSingleIP() {
		return p.Addr().String()
	}
	return s
}

// networkOf is what sandbox info says of a sandbox's network:
// allowInternetAccess is false when it reaches nothing (no network, or
// every address denied with no exception), and network lists its
// allowOut and denyOut.
func networkOf(n *service.NetworkInfo, ports service.PortOptions) (bool, *sandboxNetwork) {
	out := &sandboxNetwork{MaskRequestHost: ports.Host, HTTPSPorts: ports.TLS}
	if n == nil {
		if len(out.HTTPSPorts) == 0 && out.MaskRequestHost == "" {
			out = nil
		}
		return false, out
	}
	for _, r := range n.Except {
		out.AllowOut = append(out.AllowOut, e2bEntry(r))
	}
	for _, r := range n.Deny {
		if e := e2bEntry(r); e != "::/0" || !slices.Contains(n.Deny, allTraffic+":*") {
			out.DenyOut = append(out.DenyOut, e)
		}
	}
	denyAll := slices.Contains(out.DenyOut, allTraffic)
	if len(out.AllowOut) == 0 && len(out.DenyOut) == 0 && len(out.HTTPSPorts) == 0 && out.MaskRequestHost == "" {
		out = nil
	}
	return !denyAll || len(n.Except) > 0, out
}

// updateNetwork is PUT /sandboxes/{id}/network.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request, owner string) {
	var body networkBody
	if !decodeBody(w, r, &body) {
		return
	}
	if err := body.networkConfig.checkUpdate(); err != nil {
		s.fail(w, err)
		return
	}
	internet := body.AllowInternetAccess
	if internet == nil {
		internet = body.AllowInternetAccessCamel
	}
	if _, err := s.svc.UpdateNetwork(owner, r.PathValue("id"), networkRequest(internet, &body.networkConfig)); err != nil {
		s.notFound(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// check refuses the network settings Vivarium cannot honour, naming
// them: per-host rules (header transforms), an egress proxy of the
// client's, and the public-URL options.
func (nw *networkConfig) check() error {
	if nw == nil {
		return nil
	}
	var what []string
	if len(nw.Rules) > 0 {
		what = append(what, "per-host rules (transforms)")
	}
	if len(nw.EgressProxy) > 0 && string(nw.EgressProxy) != "null" {
		what = append(what, "an egress proxy (sandboxes go out through vivarium's own)")
	}
	if len(what) > 0 {
		return fmt.Errorf("%w: network settings: %s (allowOut, denyOut and allowInternetAccess are)", errUnsupported,
			strings.Join(what, ", "))
	}
	return nil
}

// checkUpdate is check for a running sandbox's new settings: how its ports
// are reached is set when it is created.
func (nw *networkConfig) checkUpdate() error {
	if nw.MaskRequestHost != "" || len(nw.HTTPSPorts) > 0 {
		return fmt.Errorf("%w: maskRequestHost and httpsPorts are set when a sandbox is created", errUnsupported)
	}
	return nw.check()
}

// portOptions is how the server reaches the sandbox's ports: E2B's
// httpsPorts and maskRequestHost.
func (nw *networkConfig) portOptions() service.PortOptions {
	if nw == nil {
		return service.PortOptions{}
	}
	return service.PortOptions{TLS: nw.HTTPSPorts, Host: nw.MaskRequestHost}
}
