package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/internal/rpcerr"
	"github.com/leasefence/leasefence/lease/internal/backoff"
	"github.com/leasefence/leasefence/lease/internal/delayrec"
	"github.com/leasefence/leasefence/lease/internal/keywrite"
)

// MaxLockDelay is the longest lock delay WithLockDelay accepts (Consul's
// limit too): longer, and a lost holder would stall its name for minutes.
const MaxLockDelay = time.Minute

// WithLockDelay makes the session's locks, read locks and campaigns wait
// out a delay after the previous holder of their name lost it
// involuntarily (lease expired or revoked, key deleted by someone else),
// keeping their place at the head of the queue. A clean release (Unlock,
// Resign, Close) causes no delay. Use it for resources that cannot check
// a fencing token: requests a lost holder sent get time to land. It does
// not protect against a pause longer than the delay; fencing does. d must
// be from 0 (none, the default) to MaxLockDelay, else ErrInvalidArgument.
//
// d is both what the session's holdings ask of whoever follows them and
// the least the session waits out: after a loss, a lock waits the longer
// of d and the delay the lost holding asked, so sessions with different
// delays on one name are safe together. etcd measures it, from after the
// loss, in whole seconds and at least etcd's minimum TTL; it can come out
// longer, never shorter unless etcd revokes a lease early. A loss older
// than the delay its holding asked, as etcd's leases count it, delays
// nothing. Only sessions with a lock delay record their holdings and wait
// out losses: the losses of a session without one, of etcd's own Mutex or
// of etcdctl lock are not seen, and such a session never waits. TryLock
// waits out a delay too, though never a holder. A writer costs one more
// write when granted and one when released, and DelayRecordKey(name)
// stays in etcd.
func WithLockDelay(d time.Duration) Option {
	return func(o *options) error {
		if d < 0 || d > MaxLockDelay {
			return fmt.Errorf("%w: lock delay %v is outside 0 to %v", ErrInvalidArgument, d, MaxLockDelay)
		}
		o.lockDelay = d
		return nil
	}
}

// DelayRecordKey is where sessions with a lock delay record how the last
// holder of name ended. It is no lock's key and lies outside every name's
// queue, nested names' too (see OwnPrefixes). Taking name with a lock
// delay needs write permission on it.
func DelayRecordKey(name string) string { return delayPrefix + name }

// oldDelayRecordKey is where releases before the own-key prefix kept the
// record: under the parent's queue for a nested name, which blocked etcd's
// Mutex on the parent. A record found there is moved (delayWait.read).
func oldDelayRecordKey(name string) string { return name + "\x00lock-delay" }

// releaseOps record a writer's clean release in its delete's transaction.
// The record is then on no lease: nothing removes it but the next record.
func (l *Lock) releaseOps() []clientv3.Op {
	t := l.t
	if t.s.lockDelay == 0 || t.mode == Read {
		return nil
	}
	return []clientv3.Op{clientv3.OpPut(DelayRecordKey(t.name()), delayrec.Format(delayrec.Released, t.token, 0))}
}

// heldValue is the record of this writer's holding.
func (t *tracker) heldValue() string {
	return delayrec.Format(delayrec.Held, t.token, t.s.lockDelay)
}

// abandonOps, for a lock given up before it was handed out, turn its own
// "held" record into "released": nobody wrote under it.
func (l *Lock) abandonOps() []clientv3.Op {
	t := l.t
	if t.s.lockDelay == 0 || t.mode == Read {
		return nil
	}
	key := DelayRecordKey(t.name())
	return []clientv3.Op{clientv3.OpTxn(
		[]clientv3.Cmp{clientv3.Compare(clientv3.Value(key), "=", t.heldValue())},
		[]clientv3.Op{clientv3.OpPut(key, delayrec.Format(delayrec.Released, t.token, 0))}, nil)}
}

// waitDelay, once the lock's turn has come, waits out a loss of the
// previous holder, then records a writer as held (delayrec.Next decides
// each step).
func (l *Lock) waitDelay(ctx context.Context) error {
	t := l.t
	if t.s.lockDelay == 0 {
		return nil
	}
	wctx, stop := l.Context(ctx)
	defer stop()
	cctx, stopSession := t.s.bound(wctx)
	defer stopSession()
	retry := backoff.New(10*time.Millisecond, time.Second)
	d := delayWait{l: l}
	rec, err := d.read(cctx)
	for {
		if err == nil {
			var done bool
			done, rec, err = d.step(cctx, rec)
			if done {
				l.recorded.Store(t.mode == Write)
				return nil
			}
		}
		if err == nil {
			retry.Reset()
			continue
		}
		if t.end.err() != nil {
			return t.end.err()
		}
		if cctx.Err() != nil || !rpcerr.Transient(cctx, err) {
			return fmt.Errorf("lock delay: %w", err)
		}
		if err = retry.Wait(cctx); err != nil {
			return fmt.Errorf("lock delay: %w", err)
		}
		rec, err = d.read(cctx)
	}
}

// delayWait carries out the steps of one lock's wait for its name's
// record, once its turn has come.
type delayWait struct {
	l         *Lock
	announced int64 // the lost token last reported to Hooks.Delaying
}

// step carries out the step delayrec.Next gives for rec: done once the
// lock may proceed, else the record as it now stands.
func (d *delayWait) step(ctx context.Context, rec delayrec.Record) (done bool, next delayrec.Record, err error) {
	t := d.l.t
	st := delayrec.Next(rec, t.token, t.s.lockDelay, t.mode == Read)
	switch st.Action {
	case delayrec.RecordLoss:
		next, err = d.recordLoss(ctx, rec, st.Delay)
		return false, next, err
	case delayrec.Await:
		d.announce(ctx, rec)
		next, err = d.awaitChange(ctx, rec)
		return false, next, err
	case delayrec.RecordHeld:
		return d.recordHeld(ctx, rec)
	}
	return true, rec, nil
}

// leaseLeft is how long lease has left, as etcd counts it; 0 once gone.
func leaseLeft(ctx context.Context, cli *clientv3.Client, lease clientv3.LeaseID) (time.Duration, error) {
	resp, err := cli.TimeToLive(ctx, lease)
	if err != nil {
		return 0, err
	}
	return max(time.Duration(resp.TTL)*time.Second, 0), nil
}

// announce tells Hooks.Delaying, once per lost holding, that the lock
// waits out its loss, with the time left as the record's lease has it.
func (d *delayWait) announce(ctx context.Context, rec delayrec.Record) {
	t := d.l.t
	h := t.s.hooks.Delaying
	if h == nil || d.announced == rec.Token {
		return
	}
	d.announced = rec.Token
	left := rec.Left
	if left == 0 && rec.Lease != 0 {
		left, _ = leaseLeft(ctx, t.s.client, rec.Lease) // for the report only
	}
	h(t.name(), rec.Token, left)
}

// read reads the name's record, first moving one it finds in the old
// place (oldDelayRecordKey) to DelayRecordKey.
func (d *delayWait) read(ctx context.Context) (delayrec.Record, error) {
	t := d.l.t
	key, old := DelayRecordKey(t.name()), oldDelayRecordKey(t.name())
	for range 3 {
		resp, err := t.s.client.Txn(ctx).Then(clientv3.OpGet(key), clientv3.OpGet(old)).Commit()
		if err != nil {
			return delayrec.Record{}, err
		}
		cur := keywrite.FirstKV(resp.Responses[0].GetResponseRange().Kvs)
		was := keywrite.FirstKV(resp.Responses[1].GetResponseRange().Kvs)
		if was == nil {
			return delayrec.Parse(cur), nil
		}
		if err := moveRecord(ctx, t.s.client, t.name(), cur, was); err != nil {
			return delayrec.Record{}, err
		}
	}
	return delayrec.Record{}, fmt.Errorf("moving %q: %w", old, errRecordMoving)
}

// errRecordMoving: the old record kept changing while it was moved.
var errRecordMoving = errors.New("the record kept changing")

// moveRecord replaces cur (nil if none) at DelayRecordKey with the newer
// of cur and was (the old place's record, by token; cur on a tie), lease
// and all, and deletes was, unless either changed meanwhile. A record
// whose lease ended meanwhile is gone: the caller reads again.
func moveRecord(ctx context.Context, cli *clientv3.Client, name string, cur, was *mvccpb.KeyValue) error {
	key, old := DelayRecordKey(name), oldDelayRecordKey(name)
	then := []clientv3.Op{clientv3.OpDelete(old)}
	if keep := was; cur == nil || delayrec.Parse(was).Token > delayrec.Parse(cur).Token {
		then = append(then, clientv3.OpPut(key, string(keep.Value), clientv3.WithLease(clientv3.LeaseID(keep.Lease))))
	}
	_, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", keywrite.ModRevision(cur)),
			clientv3.Compare(clientv3.ModRevision(old), "=", was.ModRevision)).
		Then(then...).
		Commit()
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil
	}
	return err
}

// recordLoss records that the holding rec names was lost, to be waited
// out for delay under a new lease of it, unless the record changed
// meanwhile.
func (d *delayWait) recordLoss(ctx context.Context, rec delayrec.Record, delay time.Duration) (delayrec.Record, error) {
	t := d.l.t
	cli, key := t.s.client, DelayRecordKey(t.name())
	g, err := cli.Grant(ctx, ttlSeconds(delay))
	if err != nil {
		return rec, err
	}
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", rec.ModRev)).
		Then(clientv3.OpPut(key, delayrec.Format(delayrec.Lost, rec.Token, delay), clientv3.WithLease(g.ID))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return rec, err
	}
	if !resp.Succeeded {
		// Someone else recorded first; the unused lease expires by itself.
		return delayrec.Parse(keywrite.FirstKV(resp.Responses[0].GetResponseRange().Kvs)), nil
	}
	t.s.lg.Warn("lock delay: the previous holder lost the lock; waiting before granting",
		zap.String("key", t.key), zap.Int64("lost_token", rec.Token), zap.Duration("delay", delay))
	return delayrec.Record{State: delayrec.Lost, Token: rec.Token, Delay: delay, Lease: g.ID,
		ModRev: resp.Header.Revision, Left: time.Duration(g.TTL) * time.Second}, nil
}

// awaitChange returns the record once it is no longer rec.
func (d *delayWait) awaitChange(ctx context.Context, rec delayrec.Record) (delayrec.Record, error) {
	t := d.l.t
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	// From the next revision, so nothing is missed (catch-up: <= 100 ms).
	wch := t.s.client.Watch(wctx, DelayRecordKey(t.name()), clientv3.WithRev(rec.ModRev+1))
	for {
		select {
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				if ctx.Err() != nil {
					return rec, ctx.Err()
				}
				return d.read(ctx) // compacted, or the watch ended: read instead
			}
			if len(wr.Events) == 0 {
				continue // a progress notice
			}
			// The first change is enough: the caller decides from it.
			if ev := wr.Events[0]; ev.Type != mvccpb.DELETE {
				return delayrec.Parse(ev.Kv), nil
			}
			return delayrec.Record{}, nil
		case <-ctx.Done():
			return rec, ctx.Err()
		}
	}
}

// recordHeld records the lock as held, on the session's delay lease, if
// the record is still rec and the key still this holding's; else done is
// false, with the record as it is.
func (d *delayWait) recordHeld(ctx context.Context, rec delayrec.Record) (done bool, next delayrec.Record, err error) {
	t := d.l.t
	lease, err := t.s.delayLease(ctx)
	if err != nil {
		return false, rec, err
	}
	key := DelayRecordKey(t.name())
	resp, err := t.s.client.Txn(ctx).
		If(append(t.heldCmps(), clientv3.Compare(clientv3.ModRevision(key), "=", rec.ModRev))...).
		Then(clientv3.OpPut(key, t.heldValue(), clientv3.WithLease(lease))).
		Else(clientv3.OpGet(t.key), clientv3.OpGet(key)).
		Commit()
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// Someone revoked the delay lease: the next try grants another.
		t.s.dropDelayLease(lease)
		return false, rec, nil
	}
	if err != nil {
		return false, rec, err
	}
	if resp.Succeeded {
		return true, rec, nil
	}
	if !t.ownsFirst(resp.Responses[0].GetResponseRange().Kvs) {
		return false, rec, ErrKeyDeleted
	}
	return false, delayrec.Parse(keywrite.FirstKV(resp.Responses[1].GetResponseRange().Kvs)), nil
}

// recordOwnLoss, for a writer that recorded its holding and lost its key
// (someone else's delete, a put that moved it off the lease), records the
// loss under a fresh lease of its delay: its successors wait that long
// from now, and no longer once that has passed (the session's delay lease
// would keep the record "held" for the session's life). It runs even as
// the session closes: Close waits for it. A session whose lease ended
// leaves the record to its delay lease, which outlasts the session's.
func (l *Lock) recordOwnLoss() {
	t := l.t
	if !l.recorded.Load() || !errors.Is(t.end.err(), ErrKeyDeleted) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.s.ttl)
	defer cancel()
	cli, key := t.s.client, DelayRecordKey(t.name())
	g, err := cli.Grant(ctx, ttlSeconds(t.s.lockDelay))
	if err == nil {
		_, err = cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(key), "=", t.heldValue())).
			Then(clientv3.OpPut(key, delayrec.Format(delayrec.Lost, t.token, t.s.lockDelay), clientv3.WithLease(g.ID))).
			Commit()
	}
	if err != nil {
		t.s.lg.Debug("lock delay: the lost holding stays recorded as held on the delay lease",
			zap.String("key", t.key), zap.Error(err))
	}
}
