package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/volume"
)

// Errors of the adapter itself.
var (
	// errUnsupported: an E2B feature Vivarium does not offer.
	errUnsupported = errors.New("not supported by vivarium")
	// errUser: the request asked to act as a user other than the
	// sandbox's one.
	errUser = errors.New("unknown user")
)

// apiError is E2B's error body, on the control plane and envd's HTTP API
// alike: the SDKs raise its message with the class the status selects.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

// writeEnvdError answers with E2B's error body.
func writeEnvdError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

// httpStatus maps an error to the status E2B's HTTP APIs use for it, and
// the message for the caller. An unexpected error is logged in full and
// answered without details, which may name host paths.
func httpStatus(log *slog.Logger, err error) (int, string) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, service.ErrNotFound), errors.Is(err, volume.ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, volume.ErrExists), errors.Is(err, volume.ErrInUse):
		code = http.StatusConflict
	case errors.Is(err, volume.ErrInvalid):
		code = http.StatusBadRequest
	case errors.Is(err, volume.ErrQuota):
		code = http.StatusTooManyRequests
	case errors.Is(err, volume.ErrUnavailable):
		code = http.StatusNotImplemented
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, sandbox.ErrNoContext), errors.Is(err, service.ErrNoProcess):
		code = http.StatusNotFound
	case errors.Is(err, sandbox.ErrTooLarge), errors.Is(err, sandbox.ErrNoRoom):
		code = http.StatusInsufficientStorage // the SDKs' NotEnoughSpaceError
	case errors.Is(err, sandbox.ErrBadPath), errors.Is(err, sandbox.ErrInvalidSpec), errors.Is(err, service.ErrCannotStart):
		code = http.StatusBadRequest
	case errors.Is(err, sandbox.ErrExists), errors.Is(err, sandbox.ErrBusy), errors.Is(err, sandbox.ErrPaused):
		code = http.StatusConflict
	case errors.Is(err, errUser), errors.Is(err, sandbox.ErrPermission):
		code = http.StatusForbidden
	case errors.Is(err, service.ErrQuota):
		code = http.StatusTooManyRequests
	case errors.Is(err, service.ErrShuttingDown), errors.Is(err, sandbox.ErrSetup):
		code = http.StatusServiceUnavailable
	case errors.Is(err, sandbox.ErrClosed):
		code = http.StatusBadGateway
	case errors.Is(err, errUnsupported), errors.Is(err, sandbox.ErrUnsupported):
		code = http.StatusNotImplemented
	case errors.Is(err, context.Canceled):
		code = 499
	case errors.Is(err, netpolicy.ErrInvalid):
		code = http.StatusBadRequest
	case errors.Is(err, netpolicy.ErrNotAllowed):
		code = http.StatusForbidden
	}
	if code == http.StatusInternalServerError {
		log.Error("internal error", "err", err)
		return code, "internal error: the server's log has the details"
	}
	return code, err.Error()
}

// Connect's error codes (connectrpc.com/docs/protocol#error-codes).
const (
	codeCanceled           = "canceled"
	codeInvalidArgument    = "invalid_argument"
	codeDeadlineExceeded   = "deadline_exceeded"
	codeNotFound           = "not_found"
	codeAlreadyExists      = "already_exists"
	codePermissionDenied   = "permission_denied"
	codeResourceExhausted  = "resource_exhausted"
	codeFailedPrecondition = "failed_precondition"
	codeUnimplemented      = "unimplemented"
	codeInternal           = "internal"
	codeUnavailable        = "unavailable"
	codeUnauthenticated    = "unauthenticated"
)

// connectHTTPStatus is the HTTP status of a unary Connect error.
var connectHTTPStatus = map[string]int{
	codeCanceled:           499,
	codeInvalidArgument:    http.StatusBadRequest,
	codeDeadlineExceeded:   http.StatusGatewayTimeout,
	codeNotFound:           http.StatusNotFound,
	codeAlreadyExists:      http.StatusConflict,
	codePermissionDenied:   http.StatusForbidden,
	codeResourceExhausted:  http.StatusTooManyRequests,
	codeFailedPrecondition: http.StatusBadRequest,
	codeUnimplemented:      http.StatusNotImplemented,
	codeInternal:           http.StatusInternalServerError,
	codeUnavailable:        http.StatusServiceUnavailable,
	codeUnauthenticated:    http.StatusUnauthorized,
}

// connectError is an error with its Connect code, as the SDKs raise it:
// not_found as NotFoundError (FileNotFoundError for files), unavailable
// as the sandbox having timed out, deadline_exceeded as TimeoutError,
// invalid_argument as InvalidArgumentError, unauthenticated as
// AuthenticationError.
type connectError struct {
	code, msg string
}

func (e *connectError) Error() string { return e.code + ": " + e.msg }

func newConnectError(code, msg string) *connectError { return &connectError{code: code, msg: msg} }

// connectCode maps an error to its Connect code and message.
func connectCode(log *slog.Logger, err error) (string, string) {
	var ce *connectError
	if errors.As(err, &ce) {
		return ce.code, ce.msg
	}
	code := codeInternal
	switch {
	case errors.Is(err, service.ErrNotFound), errors.Is(err, sandbox.ErrClosed):
		code = codeUnavailable
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, service.ErrNoProcess), errors.Is(err, sandbox.ErrNoContext):
		code = codeNotFound
	case errors.Is(err, sandbox.ErrExists):
		code = codeAlreadyExists
	case errors.Is(err, sandbox.ErrBadPath), errors.Is(err, sandbox.ErrInvalidSpec), errors.Is(err, service.ErrCannotStart):
		code = codeInvalidArgument
	case errors.Is(err, errUser), errors.Is(err, sandbox.ErrPermission):
		code = codePermissionDenied
	case errors.Is(err, service.ErrQuota), errors.Is(err, sandbox.ErrTooLarge):
		code = codeResourceExhausted
	case errors.Is(err, errUnsupported), errors.Is(err, sandbox.ErrUnsupported):
		code = codeUnimplemented
	case errors.Is(err, context.DeadlineExceeded):
		code = codeDeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codeCanceled
	case errors.Is(err, service.ErrShuttingDown), errors.Is(err, sandbox.ErrSetup), errors.Is(err, sandbox.ErrBusy):
		code = codeUnavailable
	case errors.Is(err, sandbox.ErrPaused):
		code = codeFailedPrecondition
	}
	if code == codeInternal {
		log.Error("internal error", "err", err)
		return code, "internal error: the server's log has the details"
	}
	return code, err.Error()
}

type targetKey struct{}

func withTarget(ctx context.Context, t target) context.Context {
	return context.WithValue(ctx, targetKey{}, t)
}

func targetOf(r *http.Request) target { return r.Context().Value(targetKey{}).(target) }
