package lease

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// A put sent with no definite answer may be applied after the lock gave
// up and removed its key, even after that removal (a proposal a follower
// forwarded late); its key would then sit on the live session's lease,
// owned by no lock, ahead of every later waiter. So a late apply is made
// impossible: every put of a lock key also compares the mod revision of
// the key's marker (absent until needed), and the removal after an
// unanswered put moves the marker in the same transaction. A put sent
// before that removal compares the marker's old revision, and fails
// whenever it is applied.

// markerKey is the marker of the session's lock key for name: outside the
// name's prefix (a name has no control character), so that no queue read
// and no lock of etcd's own code sees it; on the session's lease, so that
// it ends with the session.
func markerKey(name string, id clientv3.LeaseID) string {
	return fmt.Sprintf("%s\x00unanswered:%x", name, int64(id))
}

// markerCmp holds while key's marker is as the session last knew it.
func (s *Session) markerCmp(name string) clientv3.Cmp {
	s.mu.Lock()
	rev := s.markers[name]
	s.mu.Unlock()
	return clientv3.Compare(clientv3.ModRevision(markerKey(name, s.id)), "=", rev)
}

// adoptMarker records that name's marker was found moved to rev: only the
// session moves it, and a move it sent may be applied after a later one.
func (s *Session) adoptMarker(name string, rev int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rev <= s.markers[name] {
		return false
	}
	if s.markers == nil {
		s.markers = make(map[string]int64)
	}
	s.markers[name] = rev
	return true
}

// withdraw removes the lock key of a put that had no definite answer, if
// it is on the session's lease, and moves the key's marker in the same
// transaction, so that the put, if etcd applies it later, fails. It
// retries until etcd answers or the session ends; the session's end takes
// the key anyway.
func (l *Lock) withdraw() {
	marker := []clientv3.Op{clientv3.OpPut(markerKey(l.name, l.s.id), "", clientv3.WithLease(l.s.id))}
	if rev := l.removeKey(clientv3.Compare(clientv3.LeaseValue(l.key), "=", int64(l.s.id)), marker, marker); rev != 0 {
		l.s.adoptMarker(l.name, rev)
	}
}

// removeLeftover deletes kv, found at the lock's own path as it is about
// to put its key, guarded by its creation revision.
func (s *Session) removeLeftover(wctx context.Context, kv *mvccpb.KeyValue) error {
	resp, err := s.client.Txn(wctx).
		If(clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision)).
		Then(clientv3.OpDelete(string(kv.Key))).
		Commit()
	if err == nil && resp.Succeeded {
		s.lg.Warn("removed a key at a lock path that was no lock",
			zap.String("key", string(kv.Key)), zap.Int64("created", kv.CreateRevision), zap.Int64("lease", kv.Lease))
	}
	return err
}
