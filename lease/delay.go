package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/internal/rpcerr"
	"github.com/leasefence/leasefence/lease/internal/backoff"
)

// MaxLockDelay is the longest lock delay WithLockDelay accepts (Consul's
// limit too): longer, and a lost holder would stall its name for minutes.
const MaxLockDelay = time.Minute

// WithLockDelay makes the session's locks, read locks and campaigns wait
// out d after the previous holder of their name lost it involuntarily
// (lease expired or revoked, key deleted by someone else), keeping their
// place at the head of the queue. A clean release (Unlock, Resign, Close)
// causes no delay. Use it for resources that cannot check a fencing token:
// requests a lost holder sent get time to land. It does not protect
// against a pause longer than d; fencing does. d must be from 0 (none, the
// default) to MaxLockDelay, else ErrInvalidArgument.
//
// etcd measures the delay from after the waiter learned of the loss, in
// whole seconds and at least etcd's minimum TTL; it can come out longer
// than d, never shorter unless etcd revokes a lease early. Every session
// that takes the name must use WithLockDelay, or its losses are not seen.
// TryLock waits out a delay too, though never a holder. A writer costs
// one more write when granted and one when released, and
// DelayRecordKey(name) stays in etcd.
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
// Mutex on the parent. A record found there is moved (readRecord).
func oldDelayRecordKey(name string) string { return name + "\x00lock-delay" }

// recordState is what a name's delay record says.
type recordState int

const (
	recordClear    recordState = iota // no record, or a clean release: no delay
	recordHeld                        // a holder took the lock and has not let go cleanly
	recordLost                        // a loss is being waited out until the record's lease expires
	recordReleased                    // a clean release; as recordClear
)

var recordWords = map[recordState]string{recordHeld: "held", recordLost: "lost", recordReleased: "released"}

type delayRecord struct {
	state  recordState
	token  int64 // the holding it is about
	modRev int64 // the record's mod revision; 0 when there is none
}

func formatRecord(state recordState, token int64) string {
	return recordWords[state] + " " + strconv.FormatInt(token, 10)
}

// parseRecord reads kv; nil, or a value not written here, is no record.
func parseRecord(kv *mvccpb.KeyValue) delayRecord {
	if kv == nil {
		return delayRecord{}
	}
	r := delayRecord{modRev: kv.ModRevision}
	word, num, _ := strings.Cut(string(kv.Value), " ")
	token, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return r
	}
	for state, w := range recordWords {
		if w == word {
			r.state, r.token = state, token
		}
	}
	return r
}

func firstKV(kvs []*mvccpb.KeyValue) *mvccpb.KeyValue {
	if len(kvs) == 0 {
		return nil
	}
	return kvs[0]
}

// releaseOps record a writer's clean release in its delete's transaction.
func (l *Lock) releaseOps() []clientv3.Op {
	t := l.t
	if t.s.lockDelay == 0 || t.mode == Read {
		return nil
	}
	return []clientv3.Op{clientv3.OpPut(DelayRecordKey(t.name), formatRecord(recordReleased, t.token))}
}

// abandonOps, for a lock given up before it was handed out, turn its own
// "held" record into "released": nobody wrote under it.
func (l *Lock) abandonOps() []clientv3.Op {
	t := l.t
	if t.s.lockDelay == 0 || t.mode == Read {
		return nil
	}
	key := DelayRecordKey(t.name)
	return []clientv3.Op{clientv3.OpTxn(
		[]clientv3.Cmp{clientv3.Compare(clientv3.Value(key), "=", formatRecord(recordHeld, t.token))},
		[]clientv3.Op{clientv3.OpPut(key, formatRecord(recordReleased, t.token))}, nil)}
}

// waitDelay, once the lock's turn has come, waits out a loss of the
// previous holder, then records a writer as held.
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
	rec, err := l.readRecord(cctx)
	for {
		if err == nil {
			var done bool
			done, rec, err = l.stepDelay(cctx, rec)
			if done {
				return nil
			}
		}
		if err == nil {
			retry.Reset()
			continue
		}
		if t.ctx.Err() != nil {
			return context.Cause(t.ctx)
		}
		if cctx.Err() != nil || !rpcerr.Transient(cctx, err) {
			return fmt.Errorf("lock delay: %w", err)
		}
		if err = retry.Wait(cctx); err != nil {
			return fmt.Errorf("lock delay: %w", err)
		}
		rec, err = l.readRecord(cctx)
	}
}

// stepDelay makes one step from what the record says: record a loss, wait
// for a recorded one to end, or record the lock as held (done).
func (l *Lock) stepDelay(ctx context.Context, rec delayRecord) (done bool, next delayRecord, err error) {
	switch {
	case rec.state == recordHeld && rec.token < l.t.token:
		// Its key is gone (this lock heads the queue), with no release recorded.
		next, err = l.recordLoss(ctx, rec)
	case rec.state == recordLost:
		next, err = l.awaitRecordChange(ctx, rec)
	case l.t.mode == Read:
		// Readers record a loss they find, but never their own holding:
		// they change nothing that a delay would protect.
		return true, rec, nil
	default:
		done, next, err = l.recordHeld(ctx, rec)
	}
	return done, next, err
}

// readRecord reads the name's record, first moving one it finds in the
// old place (oldDelayRecordKey) to DelayRecordKey.
func (l *Lock) readRecord(ctx context.Context) (delayRecord, error) {
	t := l.t
	key, old := DelayRecordKey(t.name), oldDelayRecordKey(t.name)
	for range 3 {
		resp, err := t.s.client.Txn(ctx).Then(clientv3.OpGet(key), clientv3.OpGet(old)).Commit()
		if err != nil {
			return delayRecord{}, err
		}
		cur := firstKV(resp.Responses[0].GetResponseRange().Kvs)
		was := firstKV(resp.Responses[1].GetResponseRange().Kvs)
		if was == nil {
			return parseRecord(cur), nil
		}
		if err := l.moveRecord(ctx, cur, was); err != nil {
			return delayRecord{}, err
		}
	}
	return delayRecord{}, fmt.Errorf("moving %q: %w", old, errRecordMoving)
}

// errRecordMoving: the old record kept changing while it was moved.
var errRecordMoving = errors.New("the record kept changing")

// moveRecord replaces cur (nil if none) at DelayRecordKey with the newer
// of cur and was (the old place's record, by token; cur on a tie), lease
// and all, and deletes was, unless either changed meanwhile. A record
// whose lease ended meanwhile is gone: the caller reads again.
func (l *Lock) moveRecord(ctx context.Context, cur, was *mvccpb.KeyValue) error {
	t := l.t
	key, old := DelayRecordKey(t.name), oldDelayRecordKey(t.name)
	then := []clientv3.Op{clientv3.OpDelete(old)}
	if keep := was; cur == nil || parseRecord(was).token > parseRecord(cur).token {
		then = append(then, clientv3.OpPut(key, string(keep.Value), clientv3.WithLease(clientv3.LeaseID(keep.Lease))))
	}
	_, err := t.s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", modRevision(cur)),
			clientv3.Compare(clientv3.ModRevision(old), "=", was.ModRevision)).
		Then(then...).
		Commit()
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil
	}
	return err
}

// recordLoss records that the holding rec names was lost, under a new lease
// of the delay, unless the record changed meanwhile.
func (l *Lock) recordLoss(ctx context.Context, rec delayRecord) (delayRecord, error) {
	t := l.t
	cli, key := t.s.client, DelayRecordKey(t.name)
	g, err := cli.Grant(ctx, ttlSeconds(t.s.lockDelay))
	if err != nil {
		return rec, err
	}
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", rec.modRev)).
		Then(clientv3.OpPut(key, formatRecord(recordLost, rec.token), clientv3.WithLease(g.ID))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return rec, err
	}
	if !resp.Succeeded {
		// Someone else recorded first; the unused lease expires by itself.
		return parseRecord(firstKV(resp.Responses[0].GetResponseRange().Kvs)), nil
	}
	t.s.lg.Warn("lock delay: the previous holder lost the lock; waiting before granting",
		zap.String("key", t.key), zap.Int64("lost_token", rec.token), zap.Duration("delay", t.s.lockDelay))
	return delayRecord{state: recordLost, token: rec.token, modRev: resp.Header.Revision}, nil
}

// awaitRecordChange returns the record once it is no longer rec.
func (l *Lock) awaitRecordChange(ctx context.Context, rec delayRecord) (delayRecord, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	// From the next revision, so nothing is missed (catch-up: <= 100 ms).
	wch := l.t.s.client.Watch(wctx, DelayRecordKey(l.t.name), clientv3.WithRev(rec.modRev+1))
	for {
		select {
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				if ctx.Err() != nil {
					return rec, ctx.Err()
				}
				return l.readRecord(ctx) // compacted, or the watch ended: read instead
			}
			if len(wr.Events) == 0 {
				continue // a progress notice
			}
			// The first change is enough: the caller decides from it.
			if ev := wr.Events[0]; ev.Type != mvccpb.DELETE {
				return parseRecord(ev.Kv), nil
			}
			return delayRecord{}, nil
		case <-ctx.Done():
			return rec, ctx.Err()
		}
	}
}

// recordHeld records the lock as held if the record is still rec and the
// key still this holding's; else done is false, with the record as it is.
func (l *Lock) recordHeld(ctx context.Context, rec delayRecord) (done bool, next delayRecord, err error) {
	t := l.t
	key := DelayRecordKey(t.name)
	resp, err := t.s.client.Txn(ctx).
		If(append(t.heldCmps(), clientv3.Compare(clientv3.ModRevision(key), "=", rec.modRev))...).
		Then(clientv3.OpPut(key, formatRecord(recordHeld, t.token))).
		Else(clientv3.OpGet(t.key), clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return false, rec, err
	}
	if resp.Succeeded {
		return true, rec, nil
	}
	if !t.ownsFirst(resp.Responses[0].GetResponseRange().Kvs) {
		return false, rec, ErrKeyDeleted
	}
	return false, parseRecord(firstKV(resp.Responses[1].GetResponseRange().Kvs)), nil
}
