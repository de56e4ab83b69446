package mcp

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// TestToolErrorsFromTheTable: a failed tool call reads as the table's MCP
// form of its kind, for every kind: the message where it is public, with
// what to do next where the table adds it; an internal error is logged and
// summarised.
func TestToolErrorsFromTheTable(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, k := range apierr.Table {
		named := k.Named()
		if len(named) == 0 {
			named = []error{apierr.New(k, "raised as "+k.Code)}
		}
		for _, e := range named {
			err := fmt.Errorf("sandbox sb_x: %w", e)
			want := k.Message
			if k.Public {
				want = err.Error()
			}
			if got := toolError(log, err).Error(); got != k.MCPText(want) {
				t.Errorf("%v: %q, want %q", err, got, k.MCPText(want))
			}
		}
	}
	var logged strings.Builder
	got := toolError(slog.New(slog.NewTextHandler(&logged, nil)), errors.New("open /var/lib/vivarium/secret: EIO")).Error()
	if strings.Contains(got, "/var/lib") || !strings.Contains(logged.String(), "/var/lib/vivarium/secret") {
		t.Errorf("an internal error: %q, logged %q", got, logged.String())
	}
	// The words a model acts on, as they read before the table.
	for err, want := range map[error]string{
		service.ErrNotFound: "no such sandbox: it was closed, it expired after being idle, or it never existed. " +
			"Create a new one with create_sandbox (variables and files of the old one are gone).",
		fmt.Errorf("%w: this key may have 3 live sandboxes", service.ErrQuota): "quota reached: this key may have 3 live sandboxes. " +
			"Close sandboxes you no longer need with close_sandbox, or wait for running code to finish.",
		sandbox.ErrBusy: "the sandbox is running other code; wait for it to finish, then try again.",
		// Shown now, as the HTTP API shows them (they read "internal
		// error" before the table).
		fmt.Errorf("%w: resume it first", sandbox.ErrPaused):  "sandbox paused: resume it first",
		fmt.Errorf("%w: data/x", sandbox.ErrPermission):       "permission denied: data/x",
		fmt.Errorf("%w: the disk is full", sandbox.ErrNoRoom): "no room: the disk is full",
		fmt.Errorf("%w: snap_x", service.ErrSnapshotNotFound): "snapshot not found: snap_x",
	} {
		if got := toolError(log, err).Error(); got != want {
			t.Errorf("%v: %q, want %q", err, got, want)
		}
	}
}
