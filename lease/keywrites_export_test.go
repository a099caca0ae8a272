package lease

import clientv3 "go.etcd.io/etcd/client/v3"

// PutCmps are the comparisons a put of s's lock key for name sends now.
func PutCmps(s *Session, name string) []clientv3.Cmp {
	w := s.keyWrites(name, lockKey(name, s.id))
	return w.PutCmps()
}

// Withdraw does what a lock of s does after its put of the key for name
// had no definite answer (test-only).
func Withdraw(s *Session, name string) {
	w := s.keyWrites(name, lockKey(name, s.id))
	w.Unanswered()
}

// MarkerKey is the marker of s's lock key for name (test-only).
func MarkerKey(s *Session, name string) string { return markerKey(name, s.id) }

// SetKeys makes s send its lock keys' writes (writes.go) through kv: the
// write model's lossy KV. Call it before s takes any lock.
func SetKeys(s *Session, kv clientv3.KV) { s.keys = kv }
