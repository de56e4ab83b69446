package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	sbpool "github.com/vivarium-sandbox/vivarium/internal/pool"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// oneShot times sandbox.RunOnce in this process: a fresh sandbox per
// execution, as `vivarium run` and the one-shot API do, without the cost of
// starting the vivarium binary.
func oneShot(b sandbox.Backend, w Workload) func(context.Context) error {
	return func(ctx context.Context) error {
		res, warn := sandbox.RunOnce(ctx, b, sandbox.OneShot{Request: sandbox.ExecRequest{Code: w.Code}})
		if err := checkResult(res, w.Want); err != nil {
			return err
		}
		// A sandbox that was not cleaned up is a failure of Vivarium's,
		// even if the code ran.
		return warn
	}
}

// pooledOneShots times sandbox.RunOnceOpen through a pool of ready
// one-shot sandboxes (internal/pool, as a server keeps them): each
// iteration takes a sandbox that was started beforehand, runs the code in
// it, and hands it to a tear-down that the answer does not wait for, as a
// server's one-shot does. Ready waits, untimed, until the pool has
// refilled and the last sandbox is torn down; a throughput run, which does
// not wait, also makes the sandboxes the pool cannot keep up with.
type pooledOneShots struct {
	w    Workload
	b    sandbox.Backend
	p    *sbpool.Pool
	spec sandbox.Spec

	closing sync.WaitGroup
	mu      sync.Mutex
	errs    []error // tear-downs that failed since the last Ready
}

func newPooledOneShots(b sandbox.Backend, w Workload) *pooledOneShots {
	return &pooledOneShots{w: w, b: b, spec: sandbox.Spec{OneShot: true}}
}

// setup starts the pool, one sandbox deep, as a server's default.
func (po *pooledOneShots) setup(ctx context.Context) error {
	po.p = sbpool.New(sbpool.Config{Backend: po.b, Max: 4, Min: 1})
	po.p.Prewarm(po.spec, 1)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return po.ready(ctx)
}

func (po *pooledOneShots) run(ctx context.Context) error {
	res, sb, warn := sandbox.RunOnceOpen(ctx, po.p, sandbox.OneShot{Spec: po.spec, Request: sandbox.ExecRequest{Code: po.w.Code}})
	if sb != nil {
		po.closing.Go(func() {
			if err := sb.Close(); err != nil {
				po.mu.Lock()
				po.errs = append(po.errs, err)
				po.mu.Unlock()
			}
		})
	}
	if err := checkResult(res, po.w.Want); err != nil {
		return err
	}
	return warn
}

// ready waits for the last tear-downs and a sandbox ready in the pool. A
// tear-down that failed is the error of the iteration after it.
func (po *pooledOneShots) ready(ctx context.Context) error {
	po.closing.Wait()
	po.mu.Lock()
	err := errors.Join(po.errs...)
	po.errs = nil
	po.mu.Unlock()
	if err != nil {
		return fmt.Errorf("tear-down: %w", err)
	}
	for {
		for _, st := range po.p.Stats() {
			if st.Spec.OneShot && st.Ready > 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no sandbox ready in the pool: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (po *pooledOneShots) teardown() error {
	po.closing.Wait()
	if po.p == nil {
		return nil
	}
	return errors.Join(errors.Join(po.errs...), po.p.Close())
}

// warmSandboxes times an execution in a persistent sandbox that is already
// running: the round trip of a stateful session. Each concurrent caller
// gets a sandbox of its own, initialised with w.Init.
type warmSandboxes struct {
	w    Workload
	pool *pool[sandbox.Sandbox]
}

func newWarmSandboxes(b sandbox.Backend, w Workload) *warmSandboxes {
	open := func(ctx context.Context) (sandbox.Sandbox, error) {
		sb, err := b.Create(ctx, sandbox.Spec{})
		if err != nil {
			return nil, err
		}
		res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: w.Init}, nil)
		if err == nil {
			err = checkResult(res, "")
		}
		if err != nil {
			sb.Close()
			return nil, fmt.Errorf("init: %w", err)
		}
		return sb, nil
	}
	return &warmSandboxes{w: w, pool: newPool(open, func(sb sandbox.Sandbox) error { return sb.Close() })}
}

// setup starts the first sandbox, so that no measured iteration pays for it.
func (ws *warmSandboxes) setup(ctx context.Context) error {
	return ws.pool.with(ctx, func(sandbox.Sandbox) error { return nil })
}

func (ws *warmSandboxes) run(ctx context.Context) error {
	return ws.pool.with(ctx, func(sb sandbox.Sandbox) error {
		res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: ws.w.Code}, nil)
		if err != nil {
			return err
		}
		return checkResult(res, ws.w.Want)
	})
}

func (ws *warmSandboxes) teardown() error { return ws.pool.closeAll() }

// checkResult turns an execution that did not do what the workload does
// into an error.
func checkResult(res *sandbox.Result, want string) error {
	if res.Status != sandbox.StatusOK {
		msg := string(res.Status)
		if res.Error != nil {
			msg += ": " + res.Error.Name + ": " + res.Error.Value
		}
		return fmt.Errorf("%w: %s", ErrStatus, msg)
	}
	if !strings.Contains(res.Stdout, want) {
		return fmt.Errorf("%w: printed %q, want %q", ErrOutput, res.Stdout, want)
	}
	return nil
}
