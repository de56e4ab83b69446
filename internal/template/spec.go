// Package template describes how a template is built: a base (an image,
// or another template) and the steps that make it (RUN, COPY, ADD, ENV,
// WORKDIR, USER), as E2B's Template SDK sends them and as a Dockerfile
// says them (ParseDockerfile), and the key under which each step's
// result is cached: a step's key is its parent's key and the step
// itself, so a changed step changes its own key and every key after it.
//
// Builder builds a Spec into an image of the image store (build.go): its
// COPY and ADD layers from the build's Files (copy.go), its RUN layers
// from a sandbox's upper directory (upper.go), each through the store's
// own unpacking, owners and destinations read from the image's layers
// (rootfs.go).
package template

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
)

// StepType is what a step does.
type StepType string

// The steps. Their Args are those of E2B's build API:
//
//	RUN      [command, user]        the command run by /bin/sh -c; user may be ""
//	COPY     [src, dest, user, mode] src a path of the build's files; user and mode may be ""
//	ADD      [src, dest, user, mode] as COPY, and a tar archive src is unpacked at dest
//	ENV      [key, value, ...]
//	WORKDIR  [path]
//	USER     [user]
const (
	Run     StepType = "RUN"
	Copy    StepType = "COPY"
	Add     StepType = "ADD"
	Env     StepType = "ENV"
	Workdir StepType = "WORKDIR"
	User    StepType = "USER"
)

// Step is one step of a build.
type Step struct {
	Type StepType `json:"type"`
	Args []string `json:"args"`
	// Force runs the step again, whatever the cache holds.
	Force bool `json:"force,omitempty"`
	// FilesHash names the files a COPY or an ADD takes: the digest of
	// their archive, which the cache key covers.
	FilesHash string `json:"filesHash,omitempty"`
	// BuildArgs are a RUN's build arguments (Dockerfile ARG), KEY=VALUE:
	// in its environment, not in the template's.
	BuildArgs []string `json:"buildArgs,omitempty"`
}

// Spec is a template's build.
type Spec struct {
	// FromImage names an image; FromTemplate a template. One of them.
	FromImage    string `json:"fromImage,omitempty"`
	FromTemplate string `json:"fromTemplate,omitempty"`
	Steps        []Step `json:"steps"`
	// StartCmd is run by /bin/sh -c when a sandbox of the template starts;
	// ReadyCmd says it is ready (exit status 0). Both may be "".
	StartCmd string `json:"startCmd,omitempty"`
	ReadyCmd string `json:"readyCmd,omitempty"`
	// Labels are the template's labels (Dockerfile LABEL).
	Labels map[string]string `json:"labels,omitempty"`
}

// ErrInvalid: a build that cannot be made; the message says why.
var ErrInvalid = errors.New("invalid template")

// argCounts are how many Args each step takes (ENV: pairs, at least one).
var argCounts = map[StepType][2]int{
	Run: {1, 2}, Copy: {2, 4}, Add: {2, 4}, Env: {2, -1}, Workdir: {1, 1}, User: {1, 1},
}

// MaxSteps bounds a template's steps (each RUN a sandbox, whether or
// not it makes a layer).
const MaxSteps = 1000

// Validate says what is wrong with a build, if anything.
func (s Spec) Validate() error {
	if (s.FromImage == "") == (s.FromTemplate == "") {
		return fmt.Errorf("%w: it needs one base, an image or a template", ErrInvalid)
	}
	if len(s.Steps) > MaxSteps {
		return fmt.Errorf("%w: it has %d steps, more than the %d a template may have", ErrInvalid, len(s.Steps), MaxSteps)
	}
	for i, st := range s.Steps {
		n, ok := argCounts[st.Type]
		if !ok {
			return fmt.Errorf("%w: step %d: unknown type %q", ErrInvalid, i+1, st.Type)
		}
		switch {
		case len(st.Args) < n[0] || (n[1] >= 0 && len(st.Args) > n[1]):
			return fmt.Errorf("%w: step %d (%s): %d arguments", ErrInvalid, i+1, st.Type, len(st.Args))
		case st.Type == Env && len(st.Args)%2 != 0:
			return fmt.Errorf("%w: step %d (ENV): a key without a value", ErrInvalid, i+1)
		case st.Args[0] == "":
			return fmt.Errorf("%w: step %d (%s): empty", ErrInvalid, i+1, st.Type)
		}
	}
	return nil
}

// Keys returns the cache key of each step, base being the key of what
// the build starts from (an image's digest, a template's last key).
func (s Spec) Keys(base string) []string {
	keys := make([]string, len(s.Steps))
	parent := base
	for i, st := range s.Steps {
		st.Force = false // not what the step makes, only whether it is made again
		b, _ := json.Marshal(st)
		h := sha256.New()
		h.Write([]byte(parent))
		h.Write([]byte{0})
		h.Write(b)
		parent = "sha256:" + hex.EncodeToString(h.Sum(nil))
		keys[i] = parent
	}
	return keys
}
