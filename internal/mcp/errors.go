package mcp

import (
	"errors"
	"log/slog"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
)

// ErrNoOwner: a tool was called on a transport that authenticates, without
// a verified key. The HTTP middleware refuses such requests first; this is
// the defence behind it.
var ErrNoOwner = apierr.New(apierr.Unauthorized, "no API key on this request")

// clientMessage turns an error into the text a model reads: the table's
// MCP form of its kind (apierr), which adds what to do next to the
// message. Errors the service raises are shown as the HTTP API shows
// them; anything else is logged and summarised, since it may name
// internal paths.
func clientMessage(log *slog.Logger, err error) string {
	k, msg := apierr.Answer(log, err)
	return k.MCPText(msg)
}

// toolError is a failed tool call as the model sees it: the SDK answers
// it as a result with isError and this text.
func toolError(log *slog.Logger, err error) error {
	return errors.New(clientMessage(log, err))
}
