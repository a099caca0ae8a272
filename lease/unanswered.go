package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/internal/rpcerr"
	"github.com/leasefence/leasefence/lease/internal/backoff"
)

// A put sent with no definite answer may be applied after the lock gave
// up, even after the session's cleanup (a proposal a follower forwarded
// late); so may the cleanup itself. Each lock key of a session has a
// marker, a key of the library's own on the session's lease, and these
// rules make every late copy harmless:
//
//   - Every put of the lock key (an enqueue, TryLock's put) compares the
//     marker's mod revision with what the session last knew of it, and
//     writes the marker in the same transaction. A key at the lock's path
//     on the session's lease created at a revision where the marker was
//     written too was created by a put of the session's (ownPut): no
//     other client writes both in one step. The marker as read, or etcd's
//     history of it at the key's creation revision, tells.
//   - A withdrawal (after an unanswered put) compares the marker and the
//     key as it last found them, and moves the marker: it deletes the key
//     only if it is the session's own put's, so a late copy of it fails
//     once either moved, and never deletes a later holding's key or
//     another client's key on the lease.
//   - After an unanswered put the name's marker is kept for the session's
//     life: the put may have compared the marker's absence, and would land
//     if the marker went.
//   - A session that finds the marker not as it knew it (someone deleted
//     it, a restore brought it back older) takes it as found: the next put
//     moves it on, so a late copy that compared an older state fails, and
//     a key such a copy left is the session's own put's, which it removes.
//
// writes.go lists every write with its guard.

// markerKey is the marker of the session's lock key for name: under the
// library's own prefix, outside every queue, on the session's lease.
func markerKey(name string, id clientv3.LeaseID) string {
	return fmt.Sprintf("%s%s/%x", markerPrefix, name, int64(id))
}

// markerBook is what a session knows of its markers, by lock name. The
// locks of one name take turns (gate.go); a lock that ended early may
// still send its cleanup as the next one puts, which then finds the
// marker not as the book says and takes it as found.
type markerBook struct {
	mu sync.Mutex
	m  map[string]marker
}

// marker is what the session knows of one name's marker.
type marker struct {
	rev  int64 // its mod revision as last written or found; 0: absent
	kept bool  // a put of the name had no answer: never delete it
}

func (b *markerBook) get(name string) marker {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.m[name]
}

// set records that name's marker is at rev (0: absent). A marker neither
// present nor kept is forgotten, so the book holds only names in use.
func (b *markerBook) set(name string, rev int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.m[name]
	m.rev = rev
	if m.rev == 0 && !m.kept {
		delete(b.m, name)
		return
	}
	if b.m == nil {
		b.m = make(map[string]marker)
	}
	b.m[name] = m
}

// keep records that a put of name had no answer.
func (b *markerBook) keep(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = make(map[string]marker)
	}
	m := b.m[name]
	m.kept = true
	b.m[name] = m
}

// keyWrites makes a session's writes of one name's lock key that need the
// marker: the puts, the withdrawal of an unanswered put, the removal of a
// key the session's own late put left. It decides each from what etcd
// answered and sends it; the write model (writes_model_test.go) drives it
// against a store that loses, delays and replays requests.
type keyWrites struct {
	s      *Session // its KV (keys), lease, book of markers, end and log
	name   string
	key    string
	marker string
}

// markerCmp holds while the marker is at rev (absent for 0).
func (w *keyWrites) markerCmp(rev int64) clientv3.Cmp {
	return clientv3.Compare(clientv3.ModRevision(w.marker), "=", rev)
}

// putOps put the key with value and move the marker, in one transaction.
func (w *keyWrites) putOps(value string) []clientv3.Op {
	return []clientv3.Op{
		clientv3.OpPut(w.key, value, clientv3.WithLease(w.s.id)),
		clientv3.OpPut(w.marker, "", clientv3.WithLease(w.s.id)),
	}
}

// reads read the key and the marker: a failed put's or withdrawal's Else.
func (w *keyWrites) reads() []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(w.key), clientv3.OpGet(w.marker)}
}

// readsOf is what reads returned, from the start of ops' responses.
func readsOf(resps []*pb.ResponseOp) (key, marker *mvccpb.KeyValue) {
	return firstKV(resps[0].GetResponseRange().Kvs), firstKV(resps[1].GetResponseRange().Kvs)
}

// put sends one put of the key with value, comparing the key's absence
// and the marker at what the book says, and with reads in its Then. On
// no definite answer it withdraws the put before it returns etcd's error.
func (w *keyWrites) put(ctx context.Context, value string, reads ...clientv3.Op) (*clientv3.TxnResponse, error) {
	rev := w.s.markers.get(w.name).rev
	resp, err := w.s.keys.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(w.key), "=", 0), w.markerCmp(rev)).
		Then(append(w.putOps(value), reads...)...).
		Else(w.reads()...).
		Commit()
	w.settle(rev, resp, err)
	return resp, err
}

// tryPut is put for TryLock: only if no key at all is under the name.
func (w *keyWrites) tryPut(ctx context.Context, value string, els clientv3.Op) (*clientv3.TxnResponse, error) {
	rev := w.s.markers.get(w.name).rev
	resp, err := w.s.keys.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(w.name+"/"), "=", 0).WithPrefix(), w.markerCmp(rev)).
		Then(w.putOps(value)...).
		Else(els).
		Commit()
	w.settle(rev, resp, err)
	return resp, err
}

// settle records a put's outcome: the marker moved with a put that
// applied; an unanswered one, sent comparing the marker at rev, is
// withdrawn.
func (w *keyWrites) settle(rev int64, resp *clientv3.TxnResponse, err error) {
	switch {
	case err == nil && resp.Succeeded:
		w.s.markers.set(w.name, resp.Header.Revision)
	case err != nil && !rpcerr.Definite(err):
		w.s.markers.keep(w.name)
		w.withdraw(rev, 0)
	}
}

// notPut is what a put that did not apply left to do, from the key and
// the marker its Else read: again reports whether to put again. A key the
// session's own put left (ownPut) is removed; a key someone moved off the
// session's lease, at the lock's own path, is removed by the caller
// (again false, other set); any other key there is another client's on
// the session's lease, which no lock of the session may take
// (ErrKeyInUse). With no key there, the marker was not as the book said:
// it is taken as found.
func (w *keyWrites) notPut(ctx context.Context, key, marker *mvccpb.KeyValue) (again bool, other *mvccpb.KeyValue, err error) {
	switch {
	case key == nil && w.s.writes.adoptsOnlyHigher() && modRevision(marker) <= w.s.markers.get(w.name).rev:
		return false, nil, fmt.Errorf("%w: %s", ErrKeyInUse, w.key)
	case key == nil:
		w.s.markers.set(w.name, modRevision(marker))
		return true, nil, nil
	case key.Lease != int64(w.s.id):
		return false, key, nil
	}
	mine, err := w.ownPut(ctx, key, marker)
	switch {
	case err != nil:
		return false, nil, err
	case !mine:
		return false, nil, fmt.Errorf("%w: %s is another client's key on this session's lease", ErrKeyInUse, w.key)
	}
	w.s.lg.Warn("removing a lock key that a late put of this session left",
		zap.String("key", w.key), zap.Int64("created", key.CreateRevision))
	w.withdraw(modRevision(marker), key.CreateRevision)
	return true, nil, nil
}

// ownPut tells whether key, at the lock's path, was created by a put of
// the session's: on its lease, with the marker written in the same
// transaction, so at the key's creation revision. The marker as read says
// so if it has not moved since; if it has (someone deleted it, or a
// withdrawal gave up), etcd's history at that revision does. A history
// etcd has compacted cannot tell: the key is then taken for another
// client's, which is never deleted.
func (w *keyWrites) ownPut(ctx context.Context, key, marker *mvccpb.KeyValue) (bool, error) {
	switch {
	case w.s.writes.ownsAnyLeaseKey():
		return key != nil && key.Lease == int64(w.s.id), nil
	case key == nil || key.Lease != int64(w.s.id):
		return false, nil
	case marker != nil && marker.ModRevision == key.CreateRevision:
		return true, nil
	case w.s.writes.markerOnlyAsRead():
		return false, nil
	}
	resp, err := w.s.keys.Get(ctx, w.marker, clientv3.WithRev(key.CreateRevision))
	if errors.Is(err, rpctypes.ErrCompacted) {
		w.s.lg.Warn("lock key on the session's lease, with its history compacted: taken for another client's",
			zap.String("key", w.key), zap.Int64("created", key.CreateRevision))
		return false, nil
	}
	if err != nil {
		return false, err
	}
	m := firstKV(resp.Kvs)
	return m != nil && m.ModRevision == key.CreateRevision, nil
}

func modRevision(kv *mvccpb.KeyValue) int64 {
	if kv == nil {
		return 0
	}
	return kv.ModRevision
}

// withdrawal is what a withdrawal compares and does: the marker at rev,
// the key at keyRev (0: absent), deleted if del.
type withdrawal struct {
	rev, keyRev int64
	del         bool
}

// withdraw moves the marker, which is at rev as far as the session knows,
// so that no put that compared an earlier state of it can apply; and
// deletes the key in the same step if it is the session's own put's (del,
// the key's creation revision; 0 for none known). Each try compares the
// marker and the key as last found, so a late copy fails once either
// moved; a refused try decides again from what it read. It retries an
// unanswered request until etcd answers, refuses it outright, or again
// says stop (the session ended, whose lease then takes the key).
func (w *keyWrites) withdraw(rev, del int64) {
	wait := w.s.withdrawRetries()
	next := withdrawal{rev: rev, keyRev: del, del: del != 0}
	for refused := 0; refused < withdrawRefusals; {
		cmps, then, els := w.withdrawTxn(next)
		resp, err := w.s.keys.Txn(w.s.ctx).If(cmps...).Then(then...).Else(els...).Commit()
		switch {
		case err == nil && (resp.Succeeded || w.s.writes.unguardedWithdraw()):
			w.s.markers.set(w.name, resp.Header.Revision)
			return
		case err == nil:
			refused++
			d, rerr := w.nextWithdrawal(readsOf(resp.Responses))
			if rerr == nil {
				next = d
				continue
			}
		case rpcerr.Refused(err):
			w.s.lg.Error("lock key's withdrawal refused; the key stays until this session's next lock of the name or its end",
				zap.String("key", w.key), zap.Error(err))
			return
		}
		if !wait() {
			return // the session ended: its lease takes the key
		}
	}
	w.s.lg.Warn("lock key's marker kept moving; withdrawal left to this session's next lock of the name",
		zap.String("key", w.key))
}

// withdrawTxn lays out one try of a withdrawal.
func (w *keyWrites) withdrawTxn(d withdrawal) (cmps []clientv3.Cmp, then, els []clientv3.Op) {
	if w.s.writes.unguardedWithdraw() {
		return w.unguardedWithdraw()
	}
	cmps = []clientv3.Cmp{w.markerCmp(d.rev), clientv3.Compare(clientv3.CreateRevision(w.key), "=", d.keyRev)}
	then = []clientv3.Op{clientv3.OpPut(w.marker, "", clientv3.WithLease(w.s.id))}
	if d.del {
		then = append([]clientv3.Op{clientv3.OpDelete(w.key)}, then...)
	}
	return cmps, then, w.reads()
}

// nextWithdrawal decides a withdrawal's next try from the key and marker
// a refused one read: delete the key if it is the session's own put's.
func (w *keyWrites) nextWithdrawal(key, marker *mvccpb.KeyValue) (withdrawal, error) {
	mine, err := w.ownPut(w.s.ctx, key, marker)
	if err != nil {
		return withdrawal{}, err
	}
	next := withdrawal{rev: modRevision(marker), keyRev: 0, del: mine}
	if key != nil {
		next.keyRev = key.CreateRevision
	}
	return next, nil
}

// releaseOps go with the delete of a holding's key (Unlock, cleanup): they
// delete the marker too, unless it is kept. released records that they
// applied.
func (w *keyWrites) releaseOps() []clientv3.Op {
	if w.s.markers.get(w.name).kept {
		return nil
	}
	return []clientv3.Op{clientv3.OpDelete(w.marker)}
}

// released records that a holding's key was deleted with releaseOps.
func (w *keyWrites) released() {
	if !w.s.markers.get(w.name).kept {
		w.s.markers.set(w.name, 0)
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

// keyWrites are the marker-guarded writes of the session's key for name.
func (s *Session) keyWrites(name, key string) keyWrites {
	return keyWrites{s: s, name: name, key: key, marker: markerKey(name, s.id)}
}

// withdrawRetries waits out a doubling backoff before each retry of a
// withdrawal, until the session ends.
func (s *Session) withdrawRetries() func() bool {
	retry := backoff.New(20*time.Millisecond, time.Second)
	return func() bool { return retry.Wait(s.ctx) == nil }
}
