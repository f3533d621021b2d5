package identity

// CountVerifies makes s count its password hash checks in *n.
func CountVerifies(s *Store, n *int) {
	s.verify = func(encoded, password string) (bool, error) {
		*n++
		return VerifyPassword(encoded, password)
	}
}
