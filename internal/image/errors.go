package image

import "errors"

var (
	// ErrNotFound: no image of that name in the store.
	ErrNotFound = errors.New("no such image")
	// ErrRefused: an image, archive or layer that breaks a rule of the
	// store (a path out of its root, a whiteout of the root, a digest that
	// does not match, more layers than allowed). The message says which.
	ErrRefused = errors.New("image refused")
	// ErrTooLarge: an image past a bound of the store (bytes, files).
	ErrTooLarge = errors.New("image too large")
	// ErrBadName: a reference that cannot name an image.
	ErrBadName = errors.New("not an image reference")
)
