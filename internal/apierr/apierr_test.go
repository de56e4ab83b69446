package apierr

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/pkgindex"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/volume"
)

// TestClassify: each named error, wrapped as its callers wrap it, is of
// its row; errors that wrap two named errors are of the more precise;
// anything else is internal.
func TestClassify(t *testing.T) {
	for _, c := range []struct {
		err  error
		want *Kind
	}{
		{service.ErrNotFound, NotFound},
		{service.ErrSnapshotNotFound, SnapshotNotFound},
		{volume.ErrNotFound, VolumeNotFound},
		{fs.ErrNotExist, FileNotFound},
		{sandbox.ErrNoContext, ContextNotFound},
		{service.ErrNoProcess, ProcessNotFound},
		{volume.ErrExists, Exists},
		{sandbox.ErrExists, Exists},
		{volume.ErrInUse, InUse},
		{sandbox.ErrTooLarge, TooLarge},
		{&http.MaxBytesError{Limit: 1}, TooLarge},
		{service.ErrCannotStart, CannotStart},
		{sandbox.ErrBadPath, InvalidRequest},
		{sandbox.ErrInvalidSpec, InvalidRequest},
		{sandbox.ErrNoTerminal, InvalidRequest},
		{volume.ErrInvalid, InvalidRequest},
		{netpolicy.ErrInvalid, InvalidRequest},
		{pkgindex.ErrInvalid, InvalidRequest},
		{netpolicy.ErrNotAllowed, NotAllowed},
		{pkgindex.ErrNotAllowed, NotAllowed},
		{sandbox.ErrPermission, PermissionDenied},
		{service.ErrQuota, Quota},
		{volume.ErrQuota, Quota},
		{service.ErrShuttingDown, ShuttingDown},
		{sandbox.ErrBusy, Busy},
		{sandbox.ErrPaused, Paused},
		{service.ErrAlreadyPaused, Paused},
		{sandbox.ErrNoRoom, NoRoom},
		{service.ErrNotPaused, NotPaused},
		{sandbox.ErrClosed, Closed},
		{sandbox.ErrUnsupported, Unsupported},
		{volume.ErrUnavailable, Unsupported},
		{service.ErrNoVolumes, Unsupported},
		{context.Canceled, Cancelled},
		{context.DeadlineExceeded, Timeout},
		{os.ErrDeadlineExceeded, Timeout},
		{sandbox.ErrSetup, SetupFailed},
		{sandbox.ErrPortClosed, PortClosed},
		{service.ErrPortTLS, TLSFailed},
		{New(Forbidden, "no"), Forbidden},
		// Two named errors: the more precise one.
		{fmt.Errorf("%w: %w", sandbox.ErrSetup, sandbox.ErrUnsupported), Unsupported},
		{fmt.Errorf("%w: %w", sandbox.ErrSetup, context.DeadlineExceeded), SetupFailed},
		{fmt.Errorf("%w: %w", sandbox.ErrClosed, sandbox.ErrSetup), Closed},
		{fmt.Errorf("%w: %w", sandbox.ErrPermission, fs.ErrPermission), PermissionDenied},
		{fmt.Errorf("%w: dialing: %w", service.ErrPortTLS, os.ErrDeadlineExceeded), TLSFailed},
		// A kind given by an adapter holds through wrapping.
		{fmt.Errorf("%w %q: a sandbox has its user", New(PermissionDenied, "unknown user"), "bob"), PermissionDenied},
		// Anything else.
		{errors.New("open /var/lib/vivarium/x: input/output error"), Internal},
		{fs.ErrPermission, Internal},
		{nil, Internal},
	} {
		if got := Classify(c.err); got != c.want {
			t.Errorf("%v: %s, want %s", c.err, got.Code, c.want.Code)
		}
		if c.err == nil {
			continue
		}
		wrapped := fmt.Errorf("sandbox sb_x: %w", c.err)
		if got := Classify(wrapped); got != c.want {
			t.Errorf("%v wrapped: %s, want %s", c.err, got.Code, c.want.Code)
		}
	}
}

// TestRowsMatchTheirErrors: every named error of every row is of that
// row, wrapped or not: no row is shadowed by an earlier one.
func TestRowsMatchTheirErrors(t *testing.T) {
	for _, k := range Table {
		for _, e := range k.errs {
			if got := Classify(fmt.Errorf("x: %w", e)); got != k {
				t.Errorf("%v is %s, but its row is %s", e, got.Code, k.Code)
			}
		}
	}
}

// TestTable: each code once, each row complete.
func TestTable(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range Table {
		if seen[k.Code] {
			t.Errorf("code %s twice", k.Code)
		}
		seen[k.Code] = true
		if k.Status < 400 || k.Status > 599 {
			t.Errorf("%s: status %d", k.Code, k.Status)
		}
		if _, ok := connectStatus[k.Connect]; !ok {
			t.Errorf("%s: %q is not a Connect code", k.Code, k.Connect)
		}
		if !k.Public && k.Message == "" {
			t.Errorf("%s: not public and no message to say instead", k.Code)
		}
	}
	if Table[len(Table)-1] != Internal {
		t.Error("Internal is not last")
	}
}

// TestAnswer: the 500 rule. An internal error is logged and answered
// without its details; a timeout or a cancellation, whose chain may name
// host paths too, is answered in the table's words; the others say their
// message.
func TestAnswer(t *testing.T) {
	var logged strings.Builder
	log := slog.New(slog.NewTextHandler(&logged, nil))
	secret := errors.New("open /var/lib/vivarium/secret: input/output error")
	k, msg := Answer(log, fmt.Errorf("restoring: %w", secret))
	if k != Internal || strings.Contains(msg, "/var/lib") || !strings.Contains(logged.String(), "/var/lib/vivarium/secret") {
		t.Fatalf("internal: %s %q, logged %q", k.Code, msg, logged.String())
	}
	logged.Reset()
	for _, err := range []error{
		fmt.Errorf("waiting for /var/lib/vivarium/x: %w", context.DeadlineExceeded),
		fmt.Errorf("waiting for /var/lib/vivarium/x: %w", context.Canceled),
	} {
		k, msg := Answer(log, err)
		if strings.Contains(msg, "/var/lib") || msg != k.Message {
			t.Errorf("%v: %s %q", err, k.Code, msg)
		}
	}
	if logged.Len() != 0 {
		t.Errorf("a timeout or a cancellation is logged as internal: %s", logged.String())
	}
	err := fmt.Errorf("%w: this key may have 3 live sandboxes", service.ErrQuota)
	if k, msg := Answer(log, err); k != Quota || msg != err.Error() {
		t.Errorf("quota: %s %q", k.Code, msg)
	}
	if got := Quota.MCPText("quota reached"); !strings.HasPrefix(got, "quota reached. Close sandboxes") {
		t.Errorf("quota's MCP text: %q", got)
	}
	if got := InvalidRequest.MCPText("bad"); got != "bad" {
		t.Errorf("invalid_request's MCP text: %q", got)
	}
	if TooLarge.E2B() != http.StatusInsufficientStorage || NotFound.E2B() != http.StatusNotFound {
		t.Error("E2B's statuses")
	}
}

// TestDocsErrorCodes: docs/api.md's Errors table lists every code of the
// table, with its status, and no code that no row has.
func TestDocsErrorCodes(t *testing.T) {
	doc := readDoc(t, "docs/api.md")
	_, section, ok := strings.Cut(doc, "\n## Errors\n")
	if !ok {
		t.Fatal("docs/api.md has no ## Errors section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	documented := map[string][]int{} // code: the statuses of its line
	codeCol := -1
	code := regexp.MustCompile("`([a-z_]+)`")
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if codeCol < 0 {
			codeCol = slices.IndexFunc(cells, func(c string) bool { return strings.TrimSpace(c) == "codes" })
			if codeCol < 0 || !strings.Contains(cells[0], "status") {
				t.Fatalf("docs/api.md's Errors table: header %q, want status | codes | ...", line)
			}
			continue
		}
		if strings.Trim(cells[0], " -") == "" { // the |---| line
			continue
		}
		var statuses []int
		for _, s := range strings.Split(cells[0], ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil {
				t.Fatalf("docs/api.md's Errors table: status %q in %q", s, line)
			}
			statuses = append(statuses, n)
		}
		for _, m := range code.FindAllStringSubmatch(cells[codeCol], -1) {
			documented[m[1]] = statuses
		}
	}
	for _, k := range Table {
		statuses, ok := documented[k.Code]
		switch {
		case !ok:
			t.Errorf("docs/api.md's Errors table lacks %s (%d)", k.Code, k.Status)
		case !slices.Contains(statuses, k.Status):
			t.Errorf("docs/api.md's Errors table gives %s the status %v, the API answers %d", k.Code, statuses, k.Status)
		}
		delete(documented, k.Code)
	}
	for c := range documented {
		t.Errorf("docs/api.md's Errors table lists %s, which no row of apierr.Table has", c)
	}
}

// readDoc reads a file of the repository, found from the test's working
// directory up to the module's root.
func readDoc(t *testing.T, rel string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
	b, err := os.ReadFile(filepath.Join(dir, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
