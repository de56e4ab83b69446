package service

// Owned names a live sandbox and its owner.
type Owned struct{ Owner, ID string }

// All lists every live sandbox with its owner, for what finds a sandbox
// by a credential of its own rather than by an owner's key (a signed
// file URL). It tells nothing to callers about other owners' sandboxes:
// transports use it only to check a credential against each.
func (s *Service) All() []Owned {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Owned, 0, len(s.boxes))
	for id, b := range s.boxes {
		if b != nil {
			out = append(out, Owned{Owner: b.owner, ID: id})
		}
	}
	return out
}

// OwnerOf returns the owner of the live sandbox id, for what checks a
// credential of that one sandbox's (a signed file URL sent to the
// sandbox's own host) without a key. As with All, transports use it only
// to check the credential.
func (s *Service) OwnerOf(id string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b := s.boxes[id]; b != nil {
		return b.owner, true
	}
	return "", false
}

// Exists reports whether owner has the live sandbox id, running or
// paused, as it is: unlike Get, it never resumes a paused sandbox, so
// that bookkeeping (is this sandbox still there?) costs nothing and wakes
// no one.
func (s *Service) Exists(owner, id string) bool {
	_, err := s.lookup(owner, id)
	return err == nil
}
