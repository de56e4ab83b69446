package service

import (
	"errors"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

func TestStartError(t *testing.T) {
	sh := sandbox.Command{Argv: []string{"/bin/sh", "-c", "true"}}
	for _, c := range []struct {
		err  error
		cmd  sandbox.Command
		want string // in the message; "" keeps the error as it is
	}{
		{errors.New("start /bin/sh: fork/exec /bin/sh: resource temporarily unavailable"), sh,
			"cannot start the command: fork/exec /bin/sh: resource temporarily unavailable (the sandbox is at its process limit"},
		{errors.New("start /bin/sh: fork/exec /bin/sh: no such file or directory"), sandbox.Command{Argv: sh.Argv, Dir: "/nope"},
			"cannot start the command: fork/exec /bin/sh: no such file or directory (working directory /nope)"},
		{errors.New("start /bin/sh: " + strings.Repeat("x", 400)), sh, strings.Repeat("x", 300) + "…"},
		{sandbox.ErrClosed, sh, ""},
		{errors.New("something else"), sh, ""},
	} {
		got := startError(c.err, c.cmd)
		if c.want == "" {
			if got != c.err {
				t.Errorf("%v: became %v, want it kept", c.err, got)
			}
			continue
		}
		if !errors.Is(got, ErrCannotStart) || !strings.Contains(got.Error(), c.want) {
			t.Errorf("%v: got %v, want ErrCannotStart with %q", c.err, got, c.want)
		}
	}
}
