package portproxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
)

// TestErrorsFromTheTable: a request to a port that fails is answered with
// the status and code of apierr's table, for every kind; what the table
// does not know is the sandbox's server's doing (bad_gateway), not the
// server's (internal).
func TestErrorsFromTheTable(t *testing.T) {
	for _, k := range apierr.Table {
		named := k.Named()
		if len(named) == 0 {
			named = []error{apierr.New(k, "raised as "+k.Code)}
		}
		want := k
		if k == apierr.Internal {
			want = apierr.BadGateway
			named = append(named, errors.New("malformed HTTP response"))
		}
		for _, e := range named {
			err := fmt.Errorf("proxying: %w", e)
			rec := httptest.NewRecorder()
			WriteError(rec, err)
			var body struct {
				Error struct{ Code, Message string }
			}
			if json.Unmarshal(rec.Body.Bytes(), &body) != nil || rec.Code != want.Status || body.Error.Code != want.Code ||
				body.Error.Message == "" {
				t.Errorf("%v: %d %s, want %d %s", err, rec.Code, rec.Body, want.Status, want.Code)
			}
		}
	}
}
