package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// What happens to a sandbox whose idle timeout ends (CreateRequest.OnTimeout).
const (
	OnTimeoutKill  = "kill"
	OnTimeoutPause = "pause"
)

// ErrAlreadyPaused: Pause was asked of a paused sandbox; nothing changed.
var ErrAlreadyPaused = fmt.Errorf("%w: it is already paused", sandbox.ErrPaused)

// ErrNotPaused: Resume was asked of a running sandbox; nothing changed.
var ErrNotPaused = errors.New("the sandbox is not paused")

// pauseWait bounds a pause or resume that the service starts on its own
// (a timeout that pauses, an automatic resume).
const pauseWait = time.Minute

// pauser returns the sandbox's Pauser, or why it has none.
func (b *Box) pauser() (sandbox.Pauser, error) {
	if p, ok := b.Sandbox().(sandbox.Pauser); ok {
		return p, nil
	}
	return nil, pauseSupported(b.Sandbox(), b.backend)
}

// pauseSupported returns nil if sb can be paused, or why not.
func pauseSupported(sb sandbox.Sandbox, backend string) error {
	p, ok := sb.(sandbox.Pauser)
	if !ok {
		return fmt.Errorf("%w: sandboxes of the %s backend cannot be paused (the native backend's can, with CRIU, and gvisor's)",
			sandbox.ErrUnsupported, backend)
	}
	return p.PauseSupported()
}

// Pause saves the state of a sandbox's processes to disk and ends them
// (sandbox.Pauser): it then holds no memory of theirs and no execution
// slot, is listed as "paused", does not expire on its idle timeout, and
// its maximum lifetime stops running until it is resumed. It fails with
// sandbox.ErrBusy while code runs in it (and where the backend cannot
// pause a command that runs), ErrAlreadyPaused when it is paused, and
// sandbox.ErrUnsupported where its backend cannot pause.
func (s *Service) Pause(ctx context.Context, owner, id string) (Info, error) {
	return s.changeState(ctx, owner, id, s.pause)
}

// changeState does change (a pause, a resume) to an owner's sandbox.
func (s *Service) changeState(ctx context.Context, owner, id string, change func(context.Context, *Box) error) (Info, error) {
	b, err := s.lookup(owner, id)
	if err != nil {
		return Info{}, err
	}
	if err := change(ctx, b); err != nil {
		return Info{}, err
	}
	return b.info(), nil
}

func (s *Service) pause(ctx context.Context, b *Box) error {
	p, err := b.pauser()
	if err != nil {
		return err
	}
	b.pauseMu.Lock()
	defer b.pauseMu.Unlock()
	b.mu.Lock()
	if err := b.pauseRefused(); err != nil {
		b.mu.Unlock()
		return err
	}
	// Commands may run: the backend pauses them with the sandbox, or
	// refuses (sandbox.ErrBusy) what it cannot.
	b.running++ // nothing expires it meanwhile
	b.mu.Unlock()
	start := time.Now()
	err = p.Pause(ctx)
	b.mu.Lock()
	b.running--
	if err == nil {
		b.paused, b.pausedAt = true, s.cfg.Now()
	}
	b.mu.Unlock()
	if err != nil {
		s.cfg.Logger.Warn("sandbox pause", "id", b.id, "err", err)
		return err
	}
	s.metrics.pauses.Add(1)
	s.cfg.Logger.Info("sandbox paused", "id", b.id, "ms", time.Since(start).Milliseconds())
	if s.keepsPaused() {
		b.mu.Lock()
		b.pauseGen++
		gen := b.pauseGen
		b.mu.Unlock()
		s.mu.Lock()
		closed := s.closed
		if !closed {
			s.persisting.Add(1) // before Close waits for it
		}
		s.mu.Unlock()
		if !closed {
			go s.persistPaused(b, gen)
		}
	}
	return nil
}

// pauseRefused says why b cannot be paused now, if it cannot: it is
// paused already, or code runs in it. Callers hold b.mu.
func (b *Box) pauseRefused() error {
	switch {
	case b.paused:
		return ErrAlreadyPaused
	case b.executing:
		return fmt.Errorf("%w: code is running; pause the sandbox once it ends (or interrupt it)", sandbox.ErrBusy)
	}
	return nil
}

// Resume brings a paused sandbox back where it was paused. Its idle
// timeout starts again, and its maximum lifetime is moved by the time it
// spent paused. It fails with ErrNotPaused for a sandbox that is not.
func (s *Service) Resume(ctx context.Context, owner, id string) (Info, error) {
	return s.changeState(ctx, owner, id, s.resume)
}

func (s *Service) resume(ctx context.Context, b *Box) error {
	p, err := b.pauser()
	if err != nil {
		return ErrNotPaused
	}
	b.pauseMu.Lock()
	defer b.pauseMu.Unlock()
	b.mu.Lock()
	paused := b.paused
	b.mu.Unlock()
	if !paused {
		return ErrNotPaused
	}
	if b.volumesLost != nil {
		return b.volumesLost
	}
	if err := s.verifyOpened(b); err != nil {
		s.cfg.Logger.Warn("sandbox resume", "id", b.id, "err", err)
		return err
	}
	start := time.Now()
	if err := s.resumeSandbox(ctx, b, p); err != nil {
		s.cfg.Logger.Warn("sandbox resume", "id", b.id, "err", err)
		return err
	}
	now := s.cfg.Now()
	b.mu.Lock()
	b.paused = false
	b.deadline = b.deadline.Add(now.Sub(b.pausedAt))
	b.expiresAt = minTime(now.Add(b.idle), b.deadline)
	b.mu.Unlock()
	s.forgetPaused(b)
	s.metrics.resumes.Add(1)
	s.cfg.Logger.Info("sandbox resumed", "id", b.id, "ms", time.Since(start).Milliseconds())
	return nil
}

// live returns an owner's sandbox for an operation on it: one paused with
// auto-resume is resumed first; one paused without it is returned as it
// is, and the operation fails with sandbox.ErrPaused.
func (s *Service) live(owner, id string) (*Box, error) {
	b, err := s.lookup(owner, id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	resume := b.paused && b.autoResume
	b.mu.Unlock()
	if resume {
		ctx, cancel := context.WithTimeout(context.Background(), pauseWait)
		defer cancel()
		if err := s.resume(ctx, b); err != nil && !errors.Is(err, ErrNotPaused) {
			return nil, fmt.Errorf("resume the paused sandbox: %w", err)
		}
	}
	return b, nil
}

// timedOut handles a sandbox whose idle timeout has ended: it is paused
// when it asked for that and can be, else closed.
func (s *Service) timedOut(b *Box) {
	b.mu.Lock()
	pause := b.onTimeout == OnTimeoutPause && !s.cfg.Now().After(b.deadline)
	b.mu.Unlock()
	if pause {
		ctx, cancel := context.WithTimeout(context.Background(), pauseWait)
		err := s.pauseOnTimeout(ctx, b)
		cancel()
		if err == nil || errors.Is(err, ErrAlreadyPaused) {
			return
		}
		if errors.Is(err, sandbox.ErrBusy) {
			return // something started meanwhile: it is not idle
		}
		if errors.Is(err, sandbox.ErrNoRoom) {
			// No disk for its images now: it stays running, not lost,
			// and the pause is tried again in a minute.
			b.mu.Lock()
			b.expiresAt = minTime(s.cfg.Now().Add(time.Minute), b.deadline)
			b.mu.Unlock()
			return
		}
	}
	// The reaper saw b idle a moment ago; a call that began since (or
	// a timeout extended since) keeps it.
	stillIdle := func() bool {
		now := s.cfg.Now()
		return b.running == 0 && (now.After(b.expiresAt) || now.After(b.deadline))
	}
	if s.removeIf(b, "expired", stillIdle) {
		s.metrics.expired.Add(1)
	}
}
