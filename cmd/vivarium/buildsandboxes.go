package main

import (
	"context"
	"errors"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/image"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/template"
)

// buildSandboxes runs a template build's RUN steps in native sandboxes
// (template.Sandboxes over native.Backend.RunBuildStep).
type buildSandboxes struct {
	backend *native.Backend
	store   *image.Store
	tenant  string
	// egress, if set, gives each step its proxy; nil: no network.
	egress func() (sandbox.Egress, error)
}

var _ template.Sandboxes = (*buildSandboxes)(nil)

// Run implements template.Sandboxes.
func (bs *buildSandboxes) Run(ctx context.Context, r template.RunRequest) error {
	step := native.BuildStep{Args: r.Args, Env: r.Env, Dir: r.Dir, User: r.User, Log: r.Log, Tenant: bs.tenant,
		Commit: r.Commit}
	for _, id := range r.Layers {
		step.Layers = append(step.Layers, bs.store.LayerDir(id))
	}
	if bs.egress != nil {
		e, err := bs.egress()
		if err != nil {
			return err
		}
		step.Egress = e
	}
	err := bs.backend.RunBuildStep(ctx, step)
	if ee := (*native.BuildExitError)(nil); errors.As(err, &ee) {
		return &template.ExitError{Status: ee.Status}
	}
	return err
}
