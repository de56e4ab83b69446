package httpapi_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
	"github.com/vivarium-sandbox/vivarium/internal/httpapi"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// TestErrorsFromTheTable: an error of each kind of apierr's table,
// raised below the API (by the backend, wrapped as backends wrap them),
// is answered with the table's status and code, its message where the
// kind's message is public, the table's words otherwise.
func TestErrorsFromTheTable(t *testing.T) {
	type raised struct {
		kind *apierr.Kind
		err  error
	}
	var cases []raised
	for _, k := range apierr.Table {
		named := k.Named()
		if len(named) == 0 {
			named = []error{apierr.New(k, "raised as "+k.Code)}
		}
		for _, e := range named {
			cases = append(cases, raised{k, fmt.Errorf("fake backend: %w", e)})
		}
	}
	cases = append(cases, raised{apierr.Internal, errors.New("open /var/lib/vivarium/secret: input/output error")})
	errs := make([]error, len(cases))
	for i, c := range cases {
		errs[i] = c.err
	}
	svc := service.New(service.Config{Backend: testutil.FailingBackend{Errs: errs}, MaxPerOwner: 1000})
	defer svc.Close()
	srv := httptest.NewServer(httpapi.New(svc, keys{"alice-key": "alice"}, nil))
	defer srv.Close()
	alice := client{t, srv.URL, "alice-key"}
	for i, c := range cases {
		status, body := alice.do("POST", "/v1/sandboxes", map[string]any{"env": map[string]string{"FAIL": strconv.Itoa(i)}})
		var e struct {
			Error struct{ Code, Message string }
		}
		if err := json.Unmarshal(body, &e); err != nil {
			t.Fatalf("%v: %s", c.err, body)
		}
		want := c.kind.Message
		if c.kind.Public {
			want = c.err.Error()
		}
		if status != c.kind.Status || e.Error.Code != c.kind.Code || e.Error.Message != want {
			t.Errorf("%v: %d %s %q, want %d %s %q", c.err, status, e.Error.Code, e.Error.Message, c.kind.Status, c.kind.Code, want)
		}
		if strings.Contains(e.Error.Message, "/var/lib") {
			t.Errorf("%v: the answer names a host path: %q", c.err, e.Error.Message)
		}
	}
}
