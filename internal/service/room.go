package service

import (
	"cmp"
	"fmt"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// sandboxRoom is what one more sandbox is counted to need under a memory
// ceiling: a sandbox at rest (its init, its Python: 8 to 20 MiB) and the
// start of its first execution.
const sandboxRoom = 32 << 20

// memoryRoom refuses n new sandboxes of backend ("": the default) for
// owner where a memory ceiling their sandboxes share has less room left
// than they need (sandboxRoom each): at once, with an error that says
// which ceiling, rather than letting the kernel make room by killing a
// process of a sandbox that already runs, which could take seconds and
// cost another sandbox its state. The server's ceiling answers
// sandbox.ErrNoRoom, the key's ErrQuota. Executions in sandboxes that
// already run are not refused: they stay within their own limits, and
// at a ceiling the kernel decides (docs/operations.md). Where the
// ceilings cannot be read, nothing is refused.
func (s *Service) memoryRoom(backend, owner string, n int) error {
	if s.cfg.MemoryHeld == nil {
		return nil
	}
	backend = cmp.Or(backend, s.cfg.Backend.Name())
	need := int64(n) * sandboxRoom
	what := "a new sandbox"
	if n > 1 {
		what = fmt.Sprintf("%d new sandboxes", n)
	}
	what = fmt.Sprintf("%s (about %d MiB)", what, need>>20)
	if held, ceiling, err := s.cfg.MemoryHeld(backend, ""); err == nil && ceiling > 0 && held+need > ceiling {
		return fmt.Errorf("%w: the server's sandboxes hold %d MiB of the %d MiB of memory it gives them all: "+
			"%s does not fit now; close sandboxes you no longer need, or try again later", sandbox.ErrNoRoom,
			held>>20, ceiling>>20, what)
	}
	tenant := s.tenantOf(owner)
	if tenant == "" {
		return nil
	}
	if held, ceiling, err := s.cfg.MemoryHeld(backend, tenant); err == nil && ceiling > 0 && held+need > ceiling {
		return fmt.Errorf("%w: this key's sandboxes hold %d MiB of the %d MiB of memory they may hold together: "+
			"%s does not fit; close sandboxes you no longer need, or free memory in them", ErrQuota,
			held>>20, ceiling>>20, what)
	}
	return nil
}
