package service

// Owned names a live sandbox and its owner.
type Owned struct{ Owner, ID string }

// Exists reports whether owner has the live sandbox id, running or
// paused, as it is: unlike Get, it never resumes a paused sandbox, so
// that bookkeeping (is this sandbox still there?) costs nothing and wakes
// no one.
func (s *Service) Exists(owner, id string) bool {
	_, err := s.lookup(owner, id)
	return err == nil
}

// Known reports whether a sandbox of id lives, whoever's it is: for what
// tells a request for a sandbox that is gone from one whose credential
// does not open it (sandboxes' ids are random, not secrets).
func (s *Service) Known(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.boxes[id] != nil
}
