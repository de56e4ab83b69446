package service

import "time"

// ExtendTimeout keeps a sandbox alive for at least d from now, within its
// maximum lifetime: a sandbox whose timeout ends later keeps it, and its
// idle timeout only ever grows. This is what connecting to a sandbox
// asks (E2B's connect): a client that connects with a shorter timeout
// than the one the sandbox was given must not shorten its life.
func (s *Service) ExtendTimeout(owner, id string, d time.Duration) (Info, error) {
	b, err := s.Get(owner, id)
	if err != nil {
		return Info{}, err
	}
	d, err = bounded("timeout", d, s.cfg.DefaultIdle, s.cfg.MaxIdle)
	if err != nil {
		return Info{}, err
	}
	b.mu.Lock()
	b.idle = max(b.idle, d)
	if end := minTime(s.cfg.Now().Add(d), b.deadline); end.After(b.expiresAt) {
		b.expiresAt = end
	}
	b.mu.Unlock()
	return b.info(), nil
}
