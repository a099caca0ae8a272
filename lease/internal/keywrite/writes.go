package keywrite

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
// lease/writes.go lists every write with its guard.

// Session is what the writes of a session's lock keys need of it. Package
// lease adapts its Session to it.
type Session interface {
	// Keys sends the writes: the session's client, or in tests a KV that
	// loses and delays requests (the write model).
	Keys() clientv3.KV
	// Lease is the session's lease, which the keys and markers are on.
	Lease() clientv3.LeaseID
	// Markers is what the session knows of its markers.
	Markers() *Book
	// Marker is the key of name's marker.
	Marker(name string) string
	// Ctx ends when the session ends: a withdrawal stops then, its lease
	// taking the key.
	Ctx() context.Context
	Log() *zap.Logger
	// Seam is the write model's mutants; empty in release builds.
	Seam() Seam
}

// Config is what every session's writes share: package lease's tuning
// and errors.
type Config struct {
	// Refusals bounds a withdrawal's answered refusals: each means the
	// marker or the key moved between its read and its write.
	Refusals int
	// InUse is what the error of a put that finds another client's key at
	// the lock's path on the session's lease wraps.
	InUse error
}

// Book is what a session knows of its markers, by lock name. The locks
// of one name take turns (lease/gate.go); a lock that ended early may
// still send its cleanup as the next one puts, which then finds the
// marker not as the book says and takes it as found. Its zero value is
// an empty book.
type Book struct {
	mu sync.Mutex
	m  map[string]marker
}

// marker is what the session knows of one name's marker.
type marker struct {
	rev  int64 // its mod revision as last written or found; 0: absent
	kept bool  // a put of the name had no answer: never delete it
}

func (b *Book) get(name string) marker {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.m[name]
}

// set records that name's marker is at rev (0: absent). A marker neither
// present nor kept is forgotten, so the book holds only names in use.
func (b *Book) set(name string, rev int64) {
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
func (b *Book) keep(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = make(map[string]marker)
	}
	m := b.m[name]
	m.kept = true
	b.m[name] = m
}

// Writes makes a session's writes of one name's lock key that need the
// marker: the puts, the withdrawal of an unanswered put, the removal of a
// key the session's own late put left. It decides each from what etcd
// answered and sends it; the write model (lease/writes_model_test.go)
// drives it against a store that loses, delays and replays requests.
type Writes struct {
	s    Session // its KV (keys), lease, book of markers, end and log
	c    *Config
	name string
	key  string
}

// New makes the writes of s's key for name.
func New(s Session, c *Config, name, key string) Writes {
	return Writes{s: s, c: c, name: name, key: key}
}

// marker is the key of the name's marker, made at each write rather than
// kept: a held lock that writes nothing more costs no copy of it.
func (w *Writes) marker() string { return w.s.Marker(w.name) }

// markerCmp holds while the marker is at rev (absent for 0).
func (w *Writes) markerCmp(rev int64) clientv3.Cmp {
	return clientv3.Compare(clientv3.ModRevision(w.marker()), "=", rev)
}

// putOps put the key with value and move the marker, in one transaction.
func (w *Writes) putOps(value string) []clientv3.Op {
	return []clientv3.Op{
		clientv3.OpPut(w.key, value, clientv3.WithLease(w.s.Lease())),
		clientv3.OpPut(w.marker(), "", clientv3.WithLease(w.s.Lease())),
	}
}

// reads read the key and the marker: a failed put's or withdrawal's Else.
func (w *Writes) reads() []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(w.key), clientv3.OpGet(w.marker())}
}

// readsOf is what reads returned, from the start of ops' responses.
func readsOf(resps []*pb.ResponseOp) (key, marker *mvccpb.KeyValue) {
	return FirstKV(resps[0].GetResponseRange().Kvs), FirstKV(resps[1].GetResponseRange().Kvs)
}

// Put sends one put of the key with value, comparing the key's absence
// and the marker at what the book says, and with reads in its Then, after
// the puts of the key and the marker. On no definite answer it withdraws
// the put before it returns etcd's error.
func (w *Writes) Put(ctx context.Context, value string, reads ...clientv3.Op) (*clientv3.TxnResponse, error) {
	rev := w.s.Markers().get(w.name).rev
	resp, err := w.s.Keys().Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(w.key), "=", 0), w.markerCmp(rev)).
		Then(append(w.putOps(value), reads...)...).
		Else(w.reads()...).
		Commit()
	w.settle(rev, resp, err)
	return resp, err
}

// TryPut is Put for TryLock: only if no key at all is under the name,
// with els its Else.
func (w *Writes) TryPut(ctx context.Context, value string, els clientv3.Op) (*clientv3.TxnResponse, error) {
	rev := w.s.Markers().get(w.name).rev
	resp, err := w.s.Keys().Txn(ctx).
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
func (w *Writes) settle(rev int64, resp *clientv3.TxnResponse, err error) {
	switch {
	case err == nil && resp.Succeeded:
		w.s.Markers().set(w.name, resp.Header.Revision)
	case err != nil && !rpcerr.Definite(err):
		w.s.Markers().keep(w.name)
		w.withdraw(rev, 0)
	}
}

// NotPut is what a Put that did not apply (resp) left to do, from the key
// and the marker its Else read: again reports whether to put again. A key
// the session's own put left is removed; a key someone moved off
// the session's lease, at the lock's own path, is removed by the caller
// (again false, other set: RemoveLeftover); any other key there is
// another client's on the session's lease, which no lock of the session
// may take (Config.InUse). With no key there, the marker was not as the
// book said: it is taken as found.
func (w *Writes) NotPut(ctx context.Context, resp *clientv3.TxnResponse) (again bool, other *mvccpb.KeyValue, err error) {
	key, marker := readsOf(resp.Responses)
	switch {
	case key == nil && w.s.Seam().adoptsOnlyHigher() && ModRevision(marker) <= w.s.Markers().get(w.name).rev:
		return false, nil, fmt.Errorf("%w: %s", w.c.InUse, w.key)
	case key == nil:
		w.s.Markers().set(w.name, ModRevision(marker))
		return true, nil, nil
	case key.Lease != int64(w.s.Lease()):
		return false, key, nil
	}
	mine, err := w.ownPut(ctx, key, marker)
	switch {
	case err != nil:
		return false, nil, err
	case !mine:
		return false, nil, fmt.Errorf("%w: %s is another client's key on this session's lease", w.c.InUse, w.key)
	}
	w.s.Log().Warn("removing a lock key that a late put of this session left",
		zap.String("key", w.key), zap.Int64("created", key.CreateRevision))
	w.withdraw(ModRevision(marker), key.CreateRevision)
	return true, nil, nil
}

// ownPut tells whether key, at the lock's path, was created by a put of
// the session's: on its lease, with the marker written in the same
// transaction, so at the key's creation revision. The marker as read says
// so if it has not moved since; if it has (someone deleted it, or a
// withdrawal gave up), etcd's history at that revision does. A history
// etcd has compacted cannot tell: the key is then taken for another
// client's, which is never deleted.
func (w *Writes) ownPut(ctx context.Context, key, marker *mvccpb.KeyValue) (bool, error) {
	switch {
	case w.s.Seam().ownsAnyLeaseKey():
		return key != nil && key.Lease == int64(w.s.Lease()), nil
	case key == nil || key.Lease != int64(w.s.Lease()):
		return false, nil
	case marker != nil && marker.ModRevision == key.CreateRevision:
		return true, nil
	case w.s.Seam().markerOnlyAsRead():
		return false, nil
	}
	resp, err := w.s.Keys().Get(ctx, w.marker(), clientv3.WithRev(key.CreateRevision))
	if errors.Is(err, rpctypes.ErrCompacted) {
		w.s.Log().Warn("lock key on the session's lease, with its history compacted: taken for another client's",
			zap.String("key", w.key), zap.Int64("created", key.CreateRevision))
		return false, nil
	}
	if err != nil {
		return false, err
	}
	m := FirstKV(resp.Kvs)
	return m != nil && m.ModRevision == key.CreateRevision, nil
}

// FirstKV is the first of kvs, or nil.
func FirstKV(kvs []*mvccpb.KeyValue) *mvccpb.KeyValue {
	if len(kvs) == 0 {
		return nil
	}
	return kvs[0]
}

// ModRevision is kv's mod revision; 0 for no key.
func ModRevision(kv *mvccpb.KeyValue) int64 {
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
func (w *Writes) withdraw(rev, del int64) {
	wait := w.retries()
	next := withdrawal{rev: rev, keyRev: del, del: del != 0}
	for refused := 0; refused < w.c.Refusals; {
		cmps, then, els := w.withdrawTxn(next)
		resp, err := w.s.Keys().Txn(w.s.Ctx()).If(cmps...).Then(then...).Else(els...).Commit()
		switch {
		case err == nil && (resp.Succeeded || w.s.Seam().unguardedWithdraw()):
			w.s.Markers().set(w.name, resp.Header.Revision)
			return
		case err == nil:
			refused++
			d, rerr := w.nextWithdrawal(readsOf(resp.Responses))
			if rerr == nil {
				next = d
				continue
			}
		case rpcerr.Refused(err):
			w.s.Log().Error("lock key's withdrawal refused; the key stays until this session's next lock of the name or its end",
				zap.String("key", w.key), zap.Error(err))
			return
		}
		if !wait() {
			return // the session ended: its lease takes the key
		}
	}
	w.s.Log().Warn("lock key's marker kept moving; withdrawal left to this session's next lock of the name",
		zap.String("key", w.key))
}

// retries waits out a doubling backoff before each retry of a withdrawal,
// until the session ends.
func (w *Writes) retries() func() bool {
	retry := backoff.New(20*time.Millisecond, time.Second)
	return func() bool { return retry.Wait(w.s.Ctx()) == nil }
}

// withdrawTxn lays out one try of a withdrawal.
func (w *Writes) withdrawTxn(d withdrawal) (cmps []clientv3.Cmp, then, els []clientv3.Op) {
	if w.s.Seam().unguardedWithdraw() {
		return w.unguardedWithdraw()
	}
	cmps = []clientv3.Cmp{w.markerCmp(d.rev), clientv3.Compare(clientv3.CreateRevision(w.key), "=", d.keyRev)}
	then = []clientv3.Op{clientv3.OpPut(w.marker(), "", clientv3.WithLease(w.s.Lease()))}
	if d.del {
		then = append([]clientv3.Op{clientv3.OpDelete(w.key)}, then...)
	}
	return cmps, then, w.reads()
}

// nextWithdrawal decides a withdrawal's next try from the key and marker
// a refused one read: delete the key if it is the session's own put's.
func (w *Writes) nextWithdrawal(key, marker *mvccpb.KeyValue) (withdrawal, error) {
	mine, err := w.ownPut(w.s.Ctx(), key, marker)
	if err != nil {
		return withdrawal{}, err
	}
	next := withdrawal{rev: ModRevision(marker), keyRev: 0, del: mine}
	if key != nil {
		next.keyRev = key.CreateRevision
	}
	return next, nil
}

// ReleaseOps go with the delete of a holding's key (Unlock, cleanup): they
// delete the marker too, unless it is kept. Released records that they
// applied.
func (w *Writes) ReleaseOps() []clientv3.Op {
	if w.s.Markers().get(w.name).kept {
		return nil
	}
	return []clientv3.Op{clientv3.OpDelete(w.marker())}
}

// Released records that a holding's key was deleted with ReleaseOps.
func (w *Writes) Released() {
	if !w.s.Markers().get(w.name).kept {
		w.s.Markers().set(w.name, 0)
	}
}

// PutCmps are the comparisons a Put sends now (for package lease's tests).
func (w *Writes) PutCmps() []clientv3.Cmp {
	return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(w.key), "=", 0), w.markerCmp(w.s.Markers().get(w.name).rev)}
}

// Unanswered does what a lock does after its put of the key had no
// definite answer: it keeps the marker and withdraws the put (for package
// lease's tests).
func (w *Writes) Unanswered() {
	w.s.Markers().keep(w.name)
	w.withdraw(w.s.Markers().get(w.name).rev, 0)
}

// RemoveLeftover deletes found, a key at the lock's own path that is no
// lock (NotPut's other), as the lock is about to put its key, through kv,
// guarded by its creation revision.
func RemoveLeftover(ctx context.Context, kv clientv3.KV, lg *zap.Logger, found *mvccpb.KeyValue) error {
	resp, err := kv.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(string(found.Key)), "=", found.CreateRevision)).
		Then(clientv3.OpDelete(string(found.Key))).
		Commit()
	if err == nil && resp.Succeeded {
		lg.Warn("removed a key at a lock path that was no lock",
			zap.String("key", string(found.Key)), zap.Int64("created", found.CreateRevision), zap.Int64("lease", found.Lease))
	}
	return err
}
