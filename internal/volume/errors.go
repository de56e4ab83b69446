package volume

import "errors"

// Errors of the volume store; transports map them to status codes.
var (
	// ErrNotFound: no volume of that ID or name belongs to the caller.
	ErrNotFound = errors.New("volume not found")
	// ErrExists: the caller already has a volume of that name.
	ErrExists = errors.New("volume already exists")
	// ErrInvalid: a name, size or mount path is not acceptable.
	ErrInvalid = errors.New("invalid volume request")
	// ErrInUse: the volume is mounted by a live sandbox.
	ErrInUse = errors.New("volume in use")
	// ErrQuota: the caller has as many volumes as it may.
	ErrQuota = errors.New("volume quota reached")
	// ErrUnavailable: this host cannot keep volumes; the text says why.
	ErrUnavailable = errors.New("volumes unavailable on this server")
)
