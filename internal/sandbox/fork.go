package sandbox

import (
	"cmp"
	"context"
	"fmt"
	"sync"
)

// reseedCode reseeds, in a copy, what a copy would otherwise share with
// its source and siblings: Python's random (from os.urandom) and numpy's
// global generator, if numpy is imported. Without a result, and leaving
// no names behind.
const reseedCode = `import sys as __viv_sys
__viv_sys.modules.get('random') and __viv_sys.modules['random'].seed()
'numpy.random' in __viv_sys.modules and __viv_sys.modules['numpy.random'].seed()
del __viv_sys`

// Reseed readies a new copy c (of a fork, of a snapshot): its random
// generators are reseeded from the OS, so that it does not share a random
// future with its source and siblings, unless same keeps the source's
// (ForkOptions.SameRandomState, FromSnapshot.SameRandomState). A copy
// that cannot be reseeded is closed, and the error returned.
func Reseed(ctx context.Context, c Sandbox, same bool) (Sandbox, error) {
	if same {
		return c, nil
	}
	res, err := c.Execute(ctx, ExecRequest{Code: reseedCode}, nil)
	switch {
	case err != nil:
		err = fmt.Errorf("reseed the copy: %w", err)
	case res.Status != StatusOK:
		err = fmt.Errorf("reseed the copy: %s %s", res.Status, res.Stderr)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// CheckForkCount refuses a fork of n copies where n is not 1 to MaxFork.
func CheckForkCount(n int) error {
	if n < 1 || n > MaxFork {
		return fmt.Errorf("%w: a fork makes 1 to %d copies, not %d", ErrInvalidSpec, MaxFork, n)
	}
	return nil
}

// Copies makes a fork's n copies, at most parallel at a time: makeCopy
// makes copy i, from a snapshot of the source the backend took, and
// returns it, or an error once it has closed what it made of it. All
// copies are made or none: where any fails, those made are closed, and
// the error is the first, with how many failed.
func Copies(n, parallel int, makeCopy func(i int) (Sandbox, error)) ([]Sandbox, error) {
	copies := make([]Sandbox, n)
	errs := make([]error, n)
	sem := make(chan struct{}, max(parallel, 1))
	var wg sync.WaitGroup
	for i := range copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			copies[i], errs[i] = makeCopy(i)
		}()
	}
	wg.Wait()
	if err := allOrNone(errs, func(i int) {
		if errs[i] == nil {
			copies[i].Close()
		}
	}); err != nil {
		return nil, err
	}
	return copies, nil
}

// allOrNone is a fork's outcome, all copies or none: nil where no copy
// failed (errs[i] is copy i's error); otherwise, once closeCopy has been
// called for every copy (made or not: it checks), the first error and how
// many of them failed.
func allOrNone(errs []error, closeCopy func(i int)) error {
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
