package lease

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// A session with a lock delay puts its "held" records on a lease of its
// own, the delay lease, whose TTL is the session's plus the delay (and
// delayLeaseMargin) and which its renewer renews with the session's lease, in the same send.
// While the session lives the records stay; once it ends, they lapse the
// delay after the session's lease does, so a record still there names a
// loss no older than the delay its holding asked, and a stale one is
// gone. A Close revokes it once no record is on it.

// delayLease returns the session's delay lease, granting it first.
func (s *Session) delayLease(ctx context.Context) (clientv3.LeaseID, error) {
	if id := s.delayID.Load(); id != 0 {
		return clientv3.LeaseID(id), nil
	}
	g, err := s.client.Grant(ctx, ttlSeconds(s.ttl+s.lockDelay+delayLeaseMargin))
	if err != nil {
		return 0, err
	}
	if !s.delayID.CompareAndSwap(0, int64(g.ID)) {
		// Another lock granted one first; this one lapses unused.
		return clientv3.LeaseID(s.delayID.Load()), nil
	}
	return g.ID, nil
}

// dropDelayLease forgets id, found gone, so that the next record is put
// on a new one.
func (s *Session) dropDelayLease(id clientv3.LeaseID) {
	s.delayID.CompareAndSwap(int64(id), 0)
}

// revokeDelayLease revokes the delay lease of a closing session if no
// record is on it any more: each clean release took its record off (a
// "released" record is on no lease), so one still on it names a holding
// that ended otherwise (its release failed, its key was deleted and its
// own loss record could not be written), which must lapse in its time.
func (s *Session) revokeDelayLease() {
	id := clientv3.LeaseID(s.delayID.Load())
	if id == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.ttl)
	defer cancel()
	ttl, err := s.client.TimeToLive(ctx, id, clientv3.WithAttachedKeys())
	if err != nil || len(ttl.Keys) > 0 {
		return // left to lapse
	}
	if _, err := s.client.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		s.lg.Debug("delay lease left to lapse", zap.Error(err))
	}
}
