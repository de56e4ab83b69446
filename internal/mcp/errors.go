package mcp

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// ErrNoOwner: a tool was called on a transport that authenticates, without
// a verified key. The HTTP middleware refuses such requests first; this is
// the defence behind it.
var ErrNoOwner = errors.New("no API key on this request")

// clientMessage turns an error of the service into a message written for
// the model: what went wrong and what to do next. Errors the service
// raises are safe to show (the HTTP API shows the same text); anything
// else is logged and summarised, since it may name internal paths.
func clientMessage(log *slog.Logger, err error) string {
	switch {
	case errors.Is(err, service.ErrNotFound):
		return "no such sandbox: it was closed, it expired after being idle, or it never existed. " +
			"Create a new one with create_sandbox (variables and files of the old one are gone)."
	case errors.Is(err, service.ErrQuota):
		return err.Error() + ". Close sandboxes you no longer need with close_sandbox, or wait for running code to finish."
	case errors.Is(err, fs.ErrNotExist):
		return "no such file in the sandbox's workspace: " + err.Error() + ". Use list_files to see what is there."
	case errors.Is(err, sandbox.ErrBusy):
		return "the sandbox is running other code; wait for it to finish, then try again."
	case errors.Is(err, context.Canceled):
		return "cancelled: the request was cancelled before it finished."
	case errors.Is(err, sandbox.ErrTooLarge), errors.Is(err, sandbox.ErrBadPath), errors.Is(err, sandbox.ErrInvalidSpec),
		errors.Is(err, sandbox.ErrClosed), errors.Is(err, sandbox.ErrSetup), errors.Is(err, sandbox.ErrUnsupported),
		errors.Is(err, service.ErrShuttingDown), errors.Is(err, service.ErrCannotStart), errors.Is(err, ErrNoOwner):
		return err.Error()
	}
	log.Error("mcp: internal error", "err", err)
	return "internal error: the server's log has the details"
}

// toolError is a failed tool call as the model sees it.
func toolError(log *slog.Logger, err error) error {
	return fmt.Errorf("%s", clientMessage(log, err))
}
