package testutil

import (
	"context"
	"errors"
	"strconv"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// FailingBackend fails every creation with the error its spec's FAIL
// variable names (an index into Errs): for tests of how the layers above a
// backend answer each kind of error.
type FailingBackend struct{ Errs []error }

func (FailingBackend) Name() string { return "failing" }

func (b FailingBackend) Create(_ context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	i, err := strconv.Atoi(spec.Env["FAIL"])
	if err != nil || i < 0 || i >= len(b.Errs) {
		return nil, errors.New("the test sent no FAIL, or one out of range")
	}
	return nil, b.Errs[i]
}
