package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
	"github.com/vivarium-sandbox/vivarium/internal/pkgindex"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"github.com/vivarium-sandbox/vivarium/internal/volume"
)

// tableErrors is an error of each kind of apierr's table, as the layers
// below raise it (wrapped), and an internal one naming a host path.
func tableErrors() ([]*apierr.Kind, []error) {
	var kinds []*apierr.Kind
	var errs []error
	for _, k := range apierr.Table {
		named := k.Named()
		if len(named) == 0 {
			named = []error{apierr.New(k, "raised as "+k.Code)}
		}
		for _, e := range named {
			kinds, errs = append(kinds, k), append(errs, fmt.Errorf("fake backend: %w", e))
		}
	}
	return append(kinds, apierr.Internal), append(errs, errors.New("open /var/lib/vivarium/secret: input/output error"))
}

// TestErrorsFromTheTable: E2B's HTTP answers (a creation that fails, here)
// and its Connect codes are the table's E2B columns, for every kind.
func TestErrorsFromTheTable(t *testing.T) {
	kinds, errs := tableErrors()
	log := slog.New(slog.DiscardHandler)
	for i, err := range errs {
		k := kinds[i]
		want := k.Message
		if k.Public {
			want = err.Error()
		}
		if status, msg := httpStatus(log, err); status != k.E2B() || msg != want {
			t.Errorf("%v: HTTP %d %q, want %d %q", err, status, msg, k.E2B(), want)
		}
		if code, msg := connectCode(log, err); code != k.Connect || msg != want {
			t.Errorf("%v: Connect %s %q, want %s %q", err, code, msg, k.Connect, want)
		}
	}

	svc := service.New(service.Config{Backend: testutil.FailingBackend{Errs: errs}, MaxPerOwner: 1000})
	defer svc.Close()
	ts := httptest.NewServer(New(Config{Service: svc, Auth: keys{"key-a": "a"}, Prefix: "/e2b"}))
	defer ts.Close()
	c := client{t, ts.URL}
	for i, err := range errs {
		resp, b := c.do("POST", "/e2b/v2/sandboxes", strings.NewReader(`{"envVars":{"FAIL":"`+strconv.Itoa(i)+`"}}`),
			map[string]string{"X-API-Key": "key-a", "Content-Type": "application/json"})
		var e apiError
		if json.Unmarshal(b, &e) != nil || resp.StatusCode != kinds[i].E2B() || e.Code != resp.StatusCode {
			t.Errorf("%v: %d %s, want %d", err, resp.StatusCode, b, kinds[i].E2B())
		}
		if strings.Contains(string(b), "/var/lib") {
			t.Errorf("%v: the answer names a host path: %s", err, b)
		}
	}
}

// TestErrorMappingChoices pins E2B's forms of the errors the adapters
// answered differently before they shared one table: E2B's answer now is
// the table's, which was the API's.
func TestErrorMappingChoices(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, c := range []struct {
		err    error
		status int
		code   string
	}{
		{service.ErrSnapshotNotFound, 404, codeNotFound},                                         // was 500, internal
		{service.ErrNotPaused, 409, apierr.ConnectFailedPrecondition},                            // was 500, internal
		{volume.ErrNotFound, 404, codeNotFound},                                                  // Connect: was internal
		{volume.ErrExists, 409, codeAlreadyExists},                                               // Connect: was internal
		{sandbox.ErrNoRoom, 507, codeResourceExhausted},                                          // Connect: was internal
		{pkgindex.ErrNotAllowed, 403, codePermissionDenied},                                      // was 500, internal
		{pkgindex.ErrInvalid, 400, codeInvalidArgument},                                          // was 500, internal
		{fmt.Errorf("%w: %w", sandbox.ErrSetup, sandbox.ErrUnsupported), 501, codeUnimplemented}, // was 503, unavailable
		{fmt.Errorf("waiting: %w", context.DeadlineExceeded), 504, codeDeadlineExceeded},         // HTTP: was 500
	} {
		status, _ := httpStatus(log, c.err)
		code, _ := connectCode(log, c.err)
		if status != c.status || code != c.code {
			t.Errorf("%v: %d %s, want %d %s", c.err, status, code, c.status, c.code)
		}
	}
}
