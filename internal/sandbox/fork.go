package sandbox

import (
	"cmp"
	"context"
	"fmt"
)

// reseedCode reseeds, in a copy, what a copy would otherwise share with
// its source and siblings: Python's random (from os.urandom) and numpy's
// global generator, if numpy is imported. Without a result, and leaving
// no names behind.
const reseedCode = `import sys as __viv_sys
__viv_sys.modules.get('random') and __viv_sys.modules['random'].seed()
'numpy.random' in __viv_sys.modules and __viv_sys.modules['numpy.random'].seed()
del __viv_sys`

// Reseed gives a copy (of a fork, of a snapshot) random generators of its
// own, unless ForkOptions.SameRandomState keeps the source's.
func Reseed(ctx context.Context, s Sandbox) error {
	res, err := s.Execute(ctx, ExecRequest{Code: reseedCode}, nil)
	if err != nil {
		return fmt.Errorf("reseed the copy: %w", err)
	}
	if res.Status != StatusOK {
		return fmt.Errorf("reseed the copy: %s %s", res.Status, res.Stderr)
	}
	return nil
}

// AllOrNone is a fork's outcome, all copies or none: nil where no copy
// failed (errs[i] is copy i's error); otherwise, once closeCopy has been
// called for every copy (made or not: it checks), the first error and how
// many of them failed.
func AllOrNone(errs []error, closeCopy func(i int)) error {
	var first error
	failed := 0
	for _, err := range errs {
		if err != nil {
			first = cmp.Or(first, err)
			failed++
		}
	}
	if first == nil {
		return nil
	}
	for i := range errs {
		closeCopy(i)
	}
	if failed > 1 {
		return fmt.Errorf("fork: %d of %d copies failed, the first: %w", failed, len(errs), first)
	}
	return fmt.Errorf("fork: %w", first)
}
