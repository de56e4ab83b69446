package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// InputFile is copied into the workspace before the code runs.
type InputFile struct {
	Name string // workspace-relative path
	Open func() (io.ReadCloser, error)
}

// OneShot is a single execution in a fresh sandbox that is destroyed
// afterwards: what `vivarium run` and the one-shot API do.
type OneShot struct {
	Spec    Spec
	Request ExecRequest
	Files   []InputFile
	// OutDir, when set, receives the workspace's regular files after the
	// run (links, FIFOs and devices skipped, each file and the total capped
	// at the disk limit).
	OutDir string
	Sink   Sink
}

// ExitSetupFailed is the exit status when the sandbox could not start, as
// docker run uses 125 for its own failures.
const ExitSetupFailed = 125

// MaxListedFiles bounds Result.Files.
const MaxListedFiles = 1000

// SetupFailed is the Result for a sandbox that could not start.
func SetupFailed(err error) *Result {
	return &Result{
		Status:   StatusSetupFailed,
		ExitCode: ExitSetupFailed,
		Results:  []Output{},
		Files:    []FileInfo{},
		Error:    &Error{Name: "SetupError", Value: err.Error()},
	}
}

// RunOnce runs job and always returns a Result. The error reports problems
// that did not change the outcome (files that could not be copied out, a
// failed clean-up), for the caller to show or log.
func RunOnce(ctx context.Context, b Backend, job OneShot) (*Result, error) {
	res, sb, warn := RunOnceOpen(ctx, b, job)
	if sb == nil {
		return res, warn
	}
	return res, errors.Join(warn, sb.Close())
}

// RunOnceOpen is RunOnce without the final Close: it returns the sandbox
// (nil if none was made) for the caller to close, so that a server can
// answer before the sandbox's tear-down is over. The processes the code
// left may still be dying when it returns.
func RunOnceOpen(ctx context.Context, b Backend, job OneShot) (res *Result, sb Sandbox, warn error) {
	job.Spec.OneShot = true
	sb, err := b.Create(ctx, job.Spec)
	if err != nil {
		return SetupFailed(err), nil, nil
	}
	res, warn, err = runIn(ctx, sb, job)
	if err != nil {
		res = SetupFailed(err)
	}
	return res, sb, warn
}

func runIn(ctx context.Context, sb Sandbox, job OneShot) (res *Result, warn, err error) {
	disk := job.Spec.Limits.WithDefaults().Disk
	for _, f := range job.Files {
		r, err := f.Open()
		if err != nil {
			return nil, nil, fmt.Errorf("input file %s: %w", f.Name, err)
		}
		err = sb.Workspace().WriteFile(f.Name, r, disk)
		r.Close()
		if err != nil {
			return nil, nil, fmt.Errorf("input file %s: %w", f.Name, err)
		}
	}
	res, err = sb.Execute(ctx, job.Request, job.Sink)
	if err != nil {
		return nil, nil, err
	}
	// Files are copied out of a workspace that holds still: every process
	// of the sandbox dead. The list alone does not wait for that.
	if q, ok := sb.(Quiescer); ok && job.OutDir != "" {
		q.Quiesce()
	}
	if res.Files, err = sb.Workspace().List(MaxListedFiles); err != nil {
		warn = fmt.Errorf("list workspace: %w", err)
	}
	if res.Files == nil {
		res.Files = []FileInfo{}
	}
	if job.OutDir != "" {
		if _, err := sb.Workspace().CopyOut(job.OutDir, disk, disk); err != nil {
			warn = errors.Join(warn, fmt.Errorf("copy files out: %w", err))
		}
	}
	return res, warn, nil
}
