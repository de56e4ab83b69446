//go:build linux

package hostile

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
)

// A sandbox's own deny list (what E2B calls denyOut) attacked from inside:
// the denied address by every spelling a client may use, and by names
// that lead to it; an exception by name does not open what is always
// refused. The world's allowlist allows all of these; only the deny list
// and the standing refusals stand in the way.
func init() { egressCases = append(egressCases, egressDenyCases...) }

var egressDenyCases = []hostileCase{
	{
		name: "egress_deny_list_evasion",
		code: egressProbe + `
import ipaddress
addr = os.environ["ADDR"]
fetch("ip", "http://" + addr + ":8000/hello.txt")
fetch("mapped", "http://[::ffff:" + addr + "]:8000/hello.txt")
fetch("name", "http://" + os.environ["ALLOWED"] + "/hello.txt")
fetch("name dot", "http://ALLOWED.TEST.:8000/hello.txt")
fetch("mixed", "http://mixed.allowed.test:8000/hello.txt")
fetch("tunnel", "https://" + os.environ["ALLOWED"] + "/")
fetch("decimal", "http://%d:8000/" % int(ipaddress.IPv4Address(addr)))
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			h.egress.attach(t, h, j, netpolicy.Request{Deny: []string{h.egress.host.Addr.String()}})
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			addr := o.vars["ADDR"]
			a := netip.MustParseAddr(addr).As4()
			decimal := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
			wantLines(t, o,
				"ip 403 vivarium: "+addr+" port 8000 is in this sandbox's deny list",
				"mapped 403 vivarium: "+addr+" port 8000 is in this sandbox's deny list",
				"name 403 vivarium: allowed.test port 8000 is refused: allowed.test resolves to "+addr+", an address in this sandbox's deny list",
				"name dot 403 vivarium: allowed.test port 8000 is refused: allowed.test resolves to "+addr+", an address in this sandbox's deny list",
				"mixed 403 vivarium: mixed.allowed.test port 8000 is refused: mixed.allowed.test resolves to 127.0.0.1, a loopback address",
				"tunnel URLError Tunnel connection failed: 403 vivarium: allowed.test port 8000 is refused",
				"decimal 403 vivarium refused")
			wantSeen(t, h.egress, "GET "+addr+":8000 refused", "GET "+addr+":8000 refused", "GET allowed.test:8000 refused",
				"GET allowed.test:8000 refused", "GET mixed.allowed.test:8000 refused", "CONNECT allowed.test:8000 refused",
				"GET "+strconv.FormatUint(uint64(decimal), 10)+":8000 refused")
		},
	},
	{
		name: "egress_deny_all_but_one_name",
		code: egressProbe + `
fetch("name", "http://" + os.environ["ALLOWED"] + "/hello.txt")
fetch("ip", "http://" + os.environ["ADDR"] + ":8000/hello.txt")
fetch("rebind", "http://rebind.allowed.test:8000/")
fetch("meta", "http://meta.allowed.test/latest/meta-data/")
fetch("api", "http://" + os.environ["API"] + "/v1/sandboxes")
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			h.egress.attach(t, h, j, netpolicy.Request{Deny: []string{"0.0.0.0/0", "[::/0]"},
				Except: []string{"allowed.test", "meta.allowed.test", "rebind.allowed.test", h.egress.host.Peer.String()}})
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			addr, api := o.vars["ADDR"], o.vars["API"]
			wantLines(t, o,
				"name ok hello from "+o.vars["NETHOST"],
				"ip 403 vivarium: "+addr+" port 8000 is in this sandbox's deny list",
				"rebind 403 vivarium: rebind.allowed.test port 8000 is refused: rebind.allowed.test resolves to 127.0.0.1, a loopback address",
				"meta 403 vivarium: meta.allowed.test port 80 is refused: meta.allowed.test resolves to 169.254.169.254, a link-local address",
				"api 403 vivarium: "+o.vars["PEER"]+" port "+api[strings.LastIndex(api, ":")+1:]+" is always refused")
			if n := h.egress.api.n.Load(); n != 0 {
				t.Errorf("the API listener on the host accepted %d connections", n)
			}
		},
	},
}
