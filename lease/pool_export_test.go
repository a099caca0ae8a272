package lease

// SessionOf is the session l was taken through: a Pool's tests wait on
// its end.
func SessionOf(l *Lock) *Session { return l.t.s }
