package lease

import (
	"context"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// A put sent with no definite answer may be applied after the lock gave
// up and removed its key, even after that removal (a proposal a follower
// forwarded late). Its key then sits on the live session's lease, owned
// by no lock, ahead of every later waiter. The session remembers each such
// key (a suspect), and two things bound how long one can block:
//   - the session's next lock of the name finds the key at its own path
//     while it holds the name's gate, so no lock of the session owns it,
//     and replaces it (Lock.enqueue);
//   - the session reads its suspects every orphanSweep, and removes those
//     it finds on its lease while no lock of it uses the name.
// Only suspects are removed: a key on the lease at a path the session
// never sent an unanswered put for may be another client's that shares
// the lease (ErrKeyInUse).

// orphanSweep is how often a session reads its suspect keys. An orphan
// blocks a name for at most this plus two round trips after etcd applies
// it.
const orphanSweep = time.Second

// suspectOrphan records that key's put had no definite answer, and starts
// the session's sweep, once.
func (s *Session) suspectOrphan(key string) {
	s.mu.Lock()
	if s.suspects == nil {
		s.suspects = make(map[string]bool)
	}
	s.suspects[key] = true
	s.mu.Unlock()
	if !s.sweeping.CompareAndSwap(false, true) {
		return
	}
	if s.track() != nil {
		return // ended: the lease takes its keys
	}
	go s.sweepOrphans()
}

// suspected tells whether key's put once had no definite answer.
func (s *Session) suspected(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.suspects[key]
}

// sweepOrphans removes orphaned lock keys every orphanSweep until the
// session ends.
func (s *Session) sweepOrphans() {
	defer s.wg.Done()
	t := time.NewTicker(orphanSweep)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		if err := s.sweepOnce(s.ctx); err != nil && s.ctx.Err() == nil {
			s.lg.Debug("orphan sweep failed; next one in a second", zap.Error(err))
		}
	}
}

// sweepOnce removes the suspect keys found on the session's lease whose
// names no lock of the session is using. A name's gate is looked at after
// its key is read: a lock holds the gate from before its put until its key
// is gone, and the delete is guarded by the creation revision read, so a
// newer key is never touched.
func (s *Session) sweepOnce(ctx context.Context) error {
	s.mu.Lock()
	keys := make([]string, 0, len(s.suspects))
	for key := range s.suspects {
		keys = append(keys, key)
	}
	s.mu.Unlock()
	for _, key := range keys {
		name, ok := QueueName([]byte(key), s.id)
		if !ok || s.gateBusy(name) {
			continue
		}
		resp, err := s.client.Get(ctx, key)
		if err != nil {
			return err
		}
		if kv := firstKV(resp.Kvs); kv != nil && kv.Lease == int64(s.id) && !s.gateBusy(name) {
			if err := s.removeOrphan(ctx, kv); err != nil {
				return err
			}
		}
	}
	return nil
}

// gateBusy tells whether a lock of the session holds or awaits name's gate.
func (s *Session) gateBusy(name string) bool {
	g, ok := s.gates.peek(name)
	return ok && len(g.ch) > 0
}

// removeOrphan deletes kv, a key at one of the session's lock paths that no
// lock of the session owns, if it is still the same key.
func (s *Session) removeOrphan(ctx context.Context, kv *mvccpb.KeyValue) error {
	resp, err := s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision)).
		Then(clientv3.OpDelete(string(kv.Key))).
		Commit()
	if err == nil && resp.Succeeded {
		s.lg.Warn("removed a lock key that no lock owned",
			zap.String("key", string(kv.Key)), zap.Int64("created", kv.CreateRevision), zap.Int64("lease", kv.Lease))
	}
	return err
}
