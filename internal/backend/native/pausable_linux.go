package native

// PauseSupported implements sandbox.Pauser: nil if the sandbox can be
// paused, else why not (what it was made with, or no CRIU on the host).
func (s *Sandbox) PauseSupported() error {
	if err := s.pausable(); err != nil {
		return err
	}
	_, err := s.b.criu()
	return err
}
