package bench

import (
	"context"
	"fmt"
	"strings"

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
