// Package apierr is the one table of the errors Vivarium's APIs answer:
// each kind of error once, with its code, its HTTP status (in Vivarium's
// API and in E2B's), its Connect code (E2B's envd) and how an MCP tool
// call words it. The adapters (httpapi, e2b, mcp, portproxy, gateway)
// answer errors from this table and from nothing else, so that one error
// reads the same through every door; docs/api.md's Errors table lists
// every code (TestDocsErrorCodes checks it).
//
// An error's kind is found from the named errors of the packages below
// the adapters (service, sandbox, volume, netpolicy, pkgindex), which
// their callers wrap with %w; an adapter that raises an error of its own
// gives it a kind with New.
package apierr

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/pkgindex"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/template"
	"github.com/vivarium-sandbox/vivarium/internal/volume"
)

// Kind is one row of the table: a kind of error and its forms.
type Kind struct {
	// Code names the kind in Vivarium's answers,
	// {"error": {"code": "busy", "message": "..."}}.
	Code string
	// Status is its HTTP status in Vivarium's API, the gateway's and a
	// sandbox port's.
	Status int
	// E2BStatus is its status in E2B's HTTP APIs (the control plane,
	// envd's file API) where E2B's SDKs expect another one than Status;
	// 0: Status.
	E2BStatus int
	// Connect is its code in Connect's answers (E2B's envd RPCs).
	Connect string
	// Public: the error's own message is written for clients (the named
	// errors' callers say what went wrong in their words) and is shown.
	// Otherwise the client is told Message instead: an internal error
	// may name host paths; a timeout's or a cancellation's chain may too.
	Public bool
	// Message is what a client is told of an error that is not Public.
	Message string
	// MCP is how a failed MCP tool call reads to the model (a result
	// with isError), "{message}" standing for the client's message; ""
	// is the message as it is. It adds what a model should do next.
	MCP string

	// errs are the named errors of the kind: an error wrapping one of
	// them is of this kind.
	errs []error
	// as matches an error by its type, beside errs.
	as func(error) bool
}

// E2B is the kind's status in E2B's HTTP APIs.
func (k *Kind) E2B() int {
	if k.E2BStatus != 0 {
		return k.E2BStatus
	}
	return k.Status
}

// MCPText is the text of a failed MCP tool call of this kind, for the
// client's message msg.
func (k *Kind) MCPText(msg string) string {
	if k.MCP == "" {
		return msg
	}
	return strings.ReplaceAll(k.MCP, "{message}", msg)
}

// Named are the named errors of the kind (none for a kind only the
// adapters raise): what a test of an adapter raises to see the kind's
// answer.
func (k *Kind) Named() []error { return slices.Clone(k.errs) }

func (k *Kind) matches(err error) bool {
	for _, e := range k.errs {
		if errors.Is(err, e) {
			return true
		}
	}
	return k.as != nil && k.as(err)
}

// Connect's error codes (connectrpc.com/docs/protocol#error-codes), the
// ones Vivarium answers.
const (
	ConnectCanceled           = "canceled"
	ConnectInvalidArgument    = "invalid_argument"
	ConnectDeadlineExceeded   = "deadline_exceeded"
	ConnectNotFound           = "not_found"
	ConnectAlreadyExists      = "already_exists"
	ConnectPermissionDenied   = "permission_denied"
	ConnectResourceExhausted  = "resource_exhausted"
	ConnectFailedPrecondition = "failed_precondition"
	ConnectUnimplemented      = "unimplemented"
	ConnectInternal           = "internal"
	ConnectUnavailable        = "unavailable"
	ConnectUnauthenticated    = "unauthenticated"
)

// connectStatus is the HTTP status of a unary Connect error, by code.
var connectStatus = map[string]int{
	ConnectCanceled:           499,
	ConnectInvalidArgument:    http.StatusBadRequest,
	ConnectDeadlineExceeded:   http.StatusGatewayTimeout,
	ConnectNotFound:           http.StatusNotFound,
	ConnectAlreadyExists:      http.StatusConflict,
	ConnectPermissionDenied:   http.StatusForbidden,
	ConnectResourceExhausted:  http.StatusTooManyRequests,
	ConnectFailedPrecondition: http.StatusBadRequest,
	ConnectUnimplemented:      http.StatusNotImplemented,
	ConnectInternal:           http.StatusInternalServerError,
	ConnectUnavailable:        http.StatusServiceUnavailable,
	ConnectUnauthenticated:    http.StatusUnauthorized,
}

// ConnectStatus is the HTTP status a unary Connect error with code is
// answered with (Connect's own table); 500 for a code it does not know.
func ConnectStatus(code string) int {
	if s, ok := connectStatus[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// The kinds whose errors the services below the adapters raise.
var (
	NotFound = &Kind{Code: "not_found", Status: http.StatusNotFound,
		// E2B's SDKs read a Connect call on a sandbox that is gone as
		// the sandbox having timed out.
		Connect: ConnectUnavailable, Public: true,
		MCP: "no such sandbox: it was closed, it expired after being idle, or it never existed. " +
			"Create a new one with create_sandbox (variables and files of the old one are gone).",
		errs: []error{service.ErrNotFound}}
	SnapshotNotFound = &Kind{Code: "snapshot_not_found", Status: http.StatusNotFound,
		Connect: ConnectNotFound, Public: true, errs: []error{service.ErrSnapshotNotFound}}
	VolumeNotFound = &Kind{Code: "volume_not_found", Status: http.StatusNotFound,
		Connect: ConnectNotFound, Public: true, errs: []error{volume.ErrNotFound}}
	TemplateNotFound = &Kind{Code: "template_not_found", Status: http.StatusNotFound,
		Connect: ConnectNotFound, Public: true,
		MCP:  "{message}. Create the sandbox without a template, or with one of the server's.",
		errs: []error{service.ErrNoTemplate, service.ErrTemplateNotFound}}
	TemplateRegistry = &Kind{Code: "template_registry_failed", Status: http.StatusServiceUnavailable,
		Connect: ConnectUnavailable, Public: true,
		MCP:  "{message}. Try again later, or create the sandbox without a template.",
		errs: []error{service.ErrRegistry}}
	FileNotFound = &Kind{Code: "file_not_found", Status: http.StatusNotFound,
		Connect: ConnectNotFound, Public: true,
		MCP:  "no such file in the sandbox's workspace: {message}. Use list_files to see what is there.",
		errs: []error{fs.ErrNotExist}}
	ContextNotFound = &Kind{Code: "context_not_found", Status: http.StatusNotFound,
		Connect: ConnectNotFound, Public: true, errs: []error{sandbox.ErrNoContext}}
	ProcessNotFound = &Kind{Code: "process_not_found", Status: http.StatusNotFound,
		Connect: ConnectNotFound, Public: true, errs: []error{service.ErrNoProcess}}
	Exists = &Kind{Code: "exists", Status: http.StatusConflict,
		Connect: ConnectAlreadyExists, Public: true, errs: []error{volume.ErrExists, sandbox.ErrExists}}
	InUse = &Kind{Code: "in_use", Status: http.StatusConflict,
		Connect: ConnectFailedPrecondition, Public: true, errs: []error{volume.ErrInUse}}
	TooLarge = &Kind{Code: "too_large", Status: http.StatusRequestEntityTooLarge,
		// The SDKs' NotEnoughSpaceError: an upload past the disk limit.
		E2BStatus: http.StatusInsufficientStorage,
		Connect:   ConnectResourceExhausted, Public: true, errs: []error{sandbox.ErrTooLarge, template.ErrTooLarge},
		as: func(err error) bool {
			var mbe *http.MaxBytesError
			return errors.As(err, &mbe)
		}}
	CannotStart = &Kind{Code: "cannot_start", Status: http.StatusBadRequest,
		Connect: ConnectInvalidArgument, Public: true, errs: []error{service.ErrCannotStart}}
	InvalidRequest = &Kind{Code: "invalid_request", Status: http.StatusBadRequest,
		Connect: ConnectInvalidArgument, Public: true,
		errs: []error{sandbox.ErrBadPath, sandbox.ErrInvalidSpec, volume.ErrInvalid, netpolicy.ErrInvalid, pkgindex.ErrInvalid,
			template.ErrInvalid}}
	NotAllowed = &Kind{Code: "not_allowed", Status: http.StatusForbidden,
		Connect: ConnectPermissionDenied, Public: true, errs: []error{netpolicy.ErrNotAllowed, pkgindex.ErrNotAllowed}}
	PermissionDenied = &Kind{Code: "permission_denied", Status: http.StatusForbidden,
		Connect: ConnectPermissionDenied, Public: true, errs: []error{sandbox.ErrPermission}}
	Quota = &Kind{Code: "quota", Status: http.StatusTooManyRequests,
		Connect: ConnectResourceExhausted, Public: true,
		MCP:  "{message}. Close sandboxes you no longer need with close_sandbox, or wait for running code to finish.",
		errs: []error{service.ErrQuota, volume.ErrQuota}}
	ShuttingDown = &Kind{Code: "shutting_down", Status: http.StatusServiceUnavailable,
		Connect: ConnectUnavailable, Public: true, errs: []error{service.ErrShuttingDown}}
	Busy = &Kind{Code: "busy", Status: http.StatusConflict,
		Connect: ConnectUnavailable, Public: true,
		MCP:  "the sandbox is running other code; wait for it to finish, then try again.",
		errs: []error{sandbox.ErrBusy}}
	Paused = &Kind{Code: "paused", Status: http.StatusConflict,
		Connect: ConnectFailedPrecondition, Public: true, errs: []error{sandbox.ErrPaused}}
	NoRoom = &Kind{Code: "no_room", Status: http.StatusInsufficientStorage,
		Connect: ConnectResourceExhausted, Public: true, errs: []error{sandbox.ErrNoRoom}}
	NotPaused = &Kind{Code: "not_paused", Status: http.StatusConflict,
		Connect: ConnectFailedPrecondition, Public: true, errs: []error{service.ErrNotPaused}}
	Closed = &Kind{Code: "closed", Status: http.StatusGone,
		// E2B answers a request to a sandbox that is not running 502.
		E2BStatus: http.StatusBadGateway,
		Connect:   ConnectUnavailable, Public: true, errs: []error{sandbox.ErrClosed}}
	Unsupported = &Kind{Code: "unsupported", Status: http.StatusNotImplemented,
		Connect: ConnectUnimplemented, Public: true, errs: []error{sandbox.ErrUnsupported, volume.ErrUnavailable}}
	Cancelled = &Kind{Code: "cancelled", Status: 499, // nginx's: the client went away
		Connect: ConnectCanceled, Message: "the request was cancelled before it finished",
		MCP: "cancelled: {message}.", errs: []error{context.Canceled}}
	Timeout = &Kind{Code: "timeout", Status: http.StatusGatewayTimeout,
		Connect: ConnectDeadlineExceeded, Message: "the request did not finish in time",
		errs: []error{context.DeadlineExceeded},
		as: func(err error) bool {
			var ne net.Error
			return errors.As(err, &ne) && ne.Timeout()
		}}
	SetupFailed = &Kind{Code: "setup_failed", Status: http.StatusServiceUnavailable,
		Connect: ConnectUnavailable, Public: true, errs: []error{sandbox.ErrSetup}}
	PortClosed = &Kind{Code: "port_closed", Status: http.StatusBadGateway,
		Connect: ConnectUnavailable, Public: true, errs: []error{sandbox.ErrPortClosed}}
	TLSFailed = &Kind{Code: "tls_failed", Status: http.StatusBadGateway,
		Connect: ConnectUnavailable, Public: true, errs: []error{service.ErrPortTLS}}
)

// The kinds the adapters raise themselves, by name or with New.
var (
	Unauthorized = &Kind{Code: "unauthorized", Status: http.StatusUnauthorized,
		Connect: ConnectUnauthenticated, Public: true}
	Forbidden = &Kind{Code: "forbidden", Status: http.StatusForbidden,
		Connect: ConnectPermissionDenied, Public: true}
	// BadGateway: a sandbox's server answered what is not HTTP.
	BadGateway = &Kind{Code: "bad_gateway", Status: http.StatusBadGateway,
		Connect: ConnectUnavailable, Message: "the sandbox's server did not answer with valid HTTP"}
	// BadPath: the gateway's refusal of a URL path that would mean
	// another once cleaned.
	BadPath = &Kind{Code: "bad_path", Status: http.StatusBadRequest,
		Connect: ConnectInvalidArgument, Public: true}
	// Conflict: a name the key has on several nodes of a cluster; what a
	// pause, resume, fork or snapshot cannot keep of a sandbox.
	Conflict = &Kind{Code: "conflict", Status: http.StatusConflict,
		Connect: ConnectFailedPrecondition, Public: true, errs: []error{sandbox.ErrCannotKeep, service.ErrBuildStarted}}
	// StateLost: what lived on a node of a cluster that is gone.
	StateLost = &Kind{Code: "state_lost", Status: http.StatusGone,
		Connect: ConnectUnavailable, Public: true}
	// NodeUnreachable: the node of a cluster a request is for does not
	// answer.
	NodeUnreachable = &Kind{Code: "node_unreachable", Status: http.StatusBadGateway,
		Connect: ConnectUnavailable, Public: true}
	// NoNode: no node of a cluster is alive.
	NoNode = &Kind{Code: "no_node", Status: http.StatusServiceUnavailable,
		Connect: ConnectUnavailable, Public: true}
	// Internal: everything else, the server's own failure: logged in
	// full, answered without details.
	Internal = &Kind{Code: "internal", Status: http.StatusInternalServerError,
		Connect: ConnectInternal, Message: "internal error: the server's log has the details"}
)

// Table is every kind, in the order Classify tries them. An error may
// wrap two named errors (sandbox.ErrSetup wrapping the backend's
// sandbox.ErrUnsupported, sandbox.ErrPermission wrapping the file
// system's error): the more precise kind comes first, so the kinds of
// what is missing lead, the kinds of the server's state (shutting down,
// setup failed) follow those of the request, and a timeout is a timeout
// only when no named error says more (a setup that timed out is
// setup_failed, with its step).
var Table = []*Kind{
	NotFound, SnapshotNotFound, VolumeNotFound, TemplateNotFound, TemplateRegistry, FileNotFound, ContextNotFound, ProcessNotFound,
	Exists, InUse, TooLarge, CannotStart, InvalidRequest, NotAllowed, PermissionDenied,
	Quota, ShuttingDown, Busy, Paused, NoRoom, NotPaused, Closed, Unsupported,
	Cancelled, SetupFailed, PortClosed, TLSFailed, Timeout,
	Unauthorized, Forbidden, BadGateway, BadPath, Conflict, StateLost, NodeUnreachable, NoNode,
	Internal,
}

// kindError is an error an adapter raised itself, of a kind it chose.
type kindError struct {
	kind *Kind
	msg  string
}

func (e *kindError) Error() string { return e.msg }

// New returns an error of kind k with message msg, for an error an
// adapter raises itself (E2B's unknown user, a port without its token).
// Wrapped with %w, it keeps its kind.
func New(k *Kind, msg string) error { return &kindError{kind: k, msg: msg} }

// Classify is the kind of err: the kind New gave it, else that of the
// first row of Table one of whose named errors err wraps, else Internal.
// A nil err is Internal too: there is nothing to answer.
func Classify(err error) *Kind {
	var ke *kindError
	if errors.As(err, &ke) {
		return ke.kind
	}
	if err != nil {
		for _, k := range Table {
			if k.matches(err) {
				return k
			}
		}
	}
	return Internal
}

// Answer is err's kind and what the client is told of it: its own
// message where the kind is Public, else the kind's Message. An internal
// error is logged in full to log first, since the client learns nothing
// of it.
func Answer(log *slog.Logger, err error) (*Kind, string) {
	k := Classify(err)
	if k == Internal && log != nil {
		log.Error("internal error", "err", err)
	}
	if !k.Public {
		return k, k.Message
	}
	return k, err.Error()
}
