package service

import (
	"context"
	"errors"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// egressSpecs records specs like specs, and can carry a proxy.
type egressSpecs struct{ specs }

func (*egressSpecs) EgressSupported() error { return nil }

// On a backend without a proxy, a request that names what to reach is
// refused, never granted as none; a request for "all" the server allows
// (E2B's default) grants none there, visibly. On a backend with one, the
// sandbox gets its proxy.
func TestNetworkPerBackend(t *testing.T) {
	rules, err := netpolicy.ParseRules([]string{"example.com", "10.0.0.0/8:*"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := NetworkConfig{Policy: &netpolicy.Server{Rules: rules}}
	for _, tc := range []struct {
		req     netpolicy.Request
		proxy   bool // with a backend that carries one
		refused bool // by a backend that does not
	}{
		{netpolicy.Request{}, false, false},
		{netpolicy.Request{All: true}, true, false},
		{netpolicy.Request{All: true, Deny: []string{"0.0.0.0/0", "[::/0]"}}, true, false},
		{netpolicy.Request{Deny: []string{"0.0.0.0/0"}}, false, false},
		{netpolicy.Request{Allow: []string{"example.com"}}, true, true},
		{netpolicy.Request{All: true, Except: []string{"10.1.1.1"}}, true, true},
	} {
		without := &specs{}
		svc := New(Config{Backend: without, Network: cfg})
		_, err := svc.Create(context.Background(), CreateRequest{Owner: "o", Network: tc.req})
		switch {
		case tc.refused && !errors.Is(err, sandbox.ErrUnsupported):
			t.Errorf("%+v without a proxy: %v, want a refusal", tc.req, err)
		case !tc.refused && !errors.Is(err, errRecorded):
			t.Errorf("%+v without a proxy: %v", tc.req, err)
		case !tc.refused && without.last(t).Egress != nil:
			t.Errorf("%+v without a proxy: the spec has one", tc.req)
		}
		svc.Close()

		with := &egressSpecs{}
		svc = New(Config{Backend: with, Network: cfg})
		if _, err := svc.Create(context.Background(), CreateRequest{Owner: "o", Network: tc.req}); !errors.Is(err, errRecorded) {
			t.Errorf("%+v with a proxy: %v", tc.req, err)
		} else if got := with.last(t).Egress != nil; got != tc.proxy {
			t.Errorf("%+v with a proxy: proxy %v, want %v", tc.req, got, tc.proxy)
		}
		svc.Close()
	}
}
