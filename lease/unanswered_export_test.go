package lease

import clientv3 "go.etcd.io/etcd/client/v3"

// PutCmps are the comparisons a put of s's lock key for name sends now.
func PutCmps(s *Session, name string) []clientv3.Cmp {
	return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(lockKey(name, s.id)), "=", 0), s.markerCmp(name)}
}

// Withdraw does what a lock of s does after its put of the key for name
// had no definite answer (test-only).
func Withdraw(s *Session, name string) {
	(&Lock{s: s, name: name, key: lockKey(name, s.id)}).withdraw()
}
