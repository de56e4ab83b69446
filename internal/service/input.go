package service

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"strings"
	"syscall"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/workspace"
)

// What the service checks of a request before a sandbox sees it, so that
// bad input is answered as the client's mistake (ErrInvalidSpec,
// ErrBadPath, ErrCannotStart: a 4xx) with a message that says what to
// change, never as the server's failure.

// ErrCannotStart: the sandbox could not start the program asked for (its
// working directory or executable does not exist there, or may not be
// used). The text after it is the sandbox's own reason.
var ErrCannotStart = errors.New("cannot start the command")

// Bounds of what a request may pass to a program. The kernel refuses a
// single argument or variable over 128 KiB (MAX_ARG_STRLEN) and a native
// sandbox's control messages are bounded too; data that large belongs in
// a file of the workspace.
const (
	maxEnvBytes  = 64 << 10 // the names and values of one request's variables
	maxArgvBytes = 64 << 10 // a command's arguments together
	maxPathBytes = 4096     // PATH_MAX
)

// sandboxWorkspace is the workspace's path inside a sandbox: where
// commands run by default, and what a relative working directory is
// relative to.
const sandboxWorkspace = "/workspace"

// checkEnv checks environment variables a request passes: names and
// values the kernel accepts, within maxEnvBytes.
func checkEnv(env map[string]string) error {
	if err := sandbox.ValidateEnv(env); err != nil {
		return err
	}
	n := 0
	for k, v := range env {
		n += len(k) + len(v) + 2 // "K=V\0"
	}
	if n > maxEnvBytes {
		return fmt.Errorf("%w: the environment variables take %d bytes, over the limit of %d: pass large data in a file",
			sandbox.ErrInvalidSpec, n, maxEnvBytes)
	}
	return nil
}

// checkArgv checks a command's arguments.
func checkArgv(argv []string) error {
	if len(argv) == 0 || argv[0] == "" {
		return fmt.Errorf("%w: empty command", sandbox.ErrInvalidSpec)
	}
	n := 0
	for _, a := range argv {
		if strings.ContainsRune(a, 0) {
			return fmt.Errorf("%w: the command contains a NUL byte", sandbox.ErrInvalidSpec)
		}
		n += len(a) + 1
	}
	if n > maxArgvBytes {
		return fmt.Errorf("%w: the command is %d bytes, over the limit of %d: write a long script to a file and run that",
			sandbox.ErrInvalidSpec, n, maxArgvBytes)
	}
	return nil
}

// checkCwd checks a command's working directory and returns it clean: an
// absolute path inside the sandbox, a relative one being relative to the
// workspace; "" is the backend's default (the workspace). Whether it
// exists is the sandbox's to tell (ErrCannotStart).
func checkCwd(cwd string) (string, error) {
	switch {
	case cwd == "":
		return "", nil
	case strings.ContainsRune(cwd, 0):
		return "", fmt.Errorf("%w: the working directory %q contains a NUL byte", sandbox.ErrInvalidSpec, cwd)
	case len(cwd) > maxPathBytes:
		return "", fmt.Errorf("%w: the working directory is %d bytes, over the limit of %d", sandbox.ErrInvalidSpec, len(cwd), maxPathBytes)
	case !strings.HasPrefix(cwd, "/"):
		cwd = sandboxWorkspace + "/" + cwd
	}
	return path.Clean(cwd), nil
}

// checkFileNames checks the names of a one-shot run's input files, which
// are workspace paths.
func checkFileNames(files []sandbox.InputFile) error {
	for _, f := range files {
		if _, err := workspace.Clean(f.Name); err != nil {
			return fmt.Errorf("input file: %w", err)
		}
	}
	return nil
}

// startError classifies a backend's failure to start a program. Backends
// report what the sandbox refused (a missing working directory or
// executable, a permission) as "start ARGV0: REASON", REASON being the
// sandbox's own words: that is the client's to fix. Anything else (the
// sandbox closed, the request cancelled) keeps its class.
func startError(err error, cmd sandbox.Command) error {
	for _, known := range []error{sandbox.ErrClosed, sandbox.ErrInvalidSpec, sandbox.ErrUnsupported, sandbox.ErrBadPath, sandbox.ErrSetup} {
		if errors.Is(err, known) {
			return err
		}
	}
	reason, ok := strings.CutPrefix(err.Error(), "start "+cmd.Argv[0]+": ")
	if !ok {
		return err
	}
	// The reason comes from inside the sandbox: bounded, and shown only
	// to the sandbox's owner.
	if len(reason) > 300 {
		reason = reason[:300] + "…"
	}
	reason = strings.ToValidUTF8(reason, "�")
	// EAGAIN from fork: the sandbox's processes (threads included) are at
	// its limit, often left by code that forked and never waited.
	if strings.HasSuffix(reason, syscall.EAGAIN.Error()) {
		reason += " (the sandbox is at its process limit: end some of its processes, or restart it)"
	}
	// "fork/exec /bin/sh: no such file or directory" is also what a
	// missing working directory looks like.
	if cmd.Dir != "" {
		return fmt.Errorf("%w: %s (working directory %s)", ErrCannotStart, reason, cmd.Dir)
	}
	return fmt.Errorf("%w: %s", ErrCannotStart, reason)
}

// withID is env with each of names set to the sandbox's id.
func withID(env map[string]string, names []string, id string) (map[string]string, error) {
	if len(names) == 0 {
		return env, nil
	}
	env = maps.Clone(env)
	if env == nil {
		env = make(map[string]string, len(names))
	}
	for _, k := range names {
		env[k] = id
	}
	return env, sandbox.ValidateEnv(env)
}

// withoutID is env without the variables that hold a sandbox's id.
func withoutID(env map[string]string, names []string) map[string]string {
	if len(names) == 0 {
		return env
	}
	env = maps.Clone(env)
	for _, k := range names {
		delete(env, k)
	}
	return env
}
