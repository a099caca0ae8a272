package lease

import (
	"context"
	"errors"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/lease/internal/keywrite"
	"github.com/leasefence/leasefence/lease/internal/queue"
)

// queue puts the key with requests that end with the session too: a
// waiter whose lease is gone must not sit in a request until ctx ends.
func (l *Lock) queue(ctx context.Context, try bool) error {
	t := l.t
	cctx, stop := t.s.bound(ctx)
	err := l.create(cctx, try)
	stop()
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// etcd knows the lease is gone before the keep-alives told the
		// session: end it, so that this call and every later one say so.
		t.s.lose("etcd refused a put on the lease: lease not found")
	}
	if err != nil && t.s.ctx.Err() != nil {
		err = context.Cause(t.s.ctx)
	}
	return err
}

// lockedBy is TryLock's error when kv holds the lock.
func lockedBy(kv *mvccpb.KeyValue) error {
	return fmt.Errorf("%w: %s (token %d)", ErrLocked, kv.Key, kv.CreateRevision)
}

// page is how many keys ahead the lock's reads return.
func (t *tracker) page() int64 {
	if t.w.shared != nil {
		return sharedPage
	}
	return queuePage
}

// create puts the lock key and reads the keys just ahead of it; with try
// set it first puts the key only if no key exists under the name.
func (l *Lock) create(ctx context.Context, try bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// Writes go out under the session, not ctx: a put cut off by ctx may
	// be applied after the cleanup, leaving a key at the queue's head. So
	// await etcd's answer (or the session's end), then remove the key if
	// ctx has ended. They keep ctx's values (a trace's span, say).
	wctx, stop := linkCause(context.WithoutCancel(ctx), l.t.s.ctx)
	err := l.enqueue(ctx, wctx, try)
	stop()
	if err == nil && l.t.token != 0 && ctx.Err() != nil {
		l.cleanup()
		return ctx.Err()
	}
	return err
}

// enqueue is create's work: its writes use wctx, its waits ctx.
func (l *Lock) enqueue(ctx, wctx context.Context, try bool) error {
	t := l.t
	if try {
		if done, err := l.tryEmpty(wctx); done || err != nil {
			return err
		}
		// Only keys that do not block were seen: queue, then look again.
	}
	// A paused Keeper's watch (watch.Watch.Granted) keeps no copy: read.
	mirrored := !try && t.w.mirror() != nil && !t.w.q().Paused()
	var reads []clientv3.Op
	if !mirrored {
		reads = append(reads, newestFirst(t.name()+"/", 0, t.page()+1))
	}
	for tries := 0; ; tries++ {
		seen := t.s.highest.Load()
		resp, err := l.kw().Put(wctx, t.hold.value, reads...)
		if err != nil {
			return err
		}
		if resp.Succeeded {
			t.setToken(resp.Header.Revision)
			t.s.probeKey.Store(t.key)
			t.s.sawRevision(seen, resp.Header.Revision)
			l.queued(ctx, resp, mirrored)
			return nil
		}
		if err := l.notPut(wctx, resp, tries); err != nil {
			return err
		}
	}
}

// notPut sees to what kept enqueue's put from applying, so that it may
// try again (keywrite.Writes.NotPut): it removes a key at the lock's own
// path that someone else's put moved off the session's lease, which is no
// lock.
func (l *Lock) notPut(wctx context.Context, resp *clientv3.TxnResponse, tries int) error {
	again, other, err := l.kw().NotPut(wctx, resp)
	switch {
	case err != nil:
		return err
	case tries >= putTries:
		return fmt.Errorf("%w: %s: the put kept failing", ErrKeyInUse, l.t.key)
	case again:
		return nil
	}
	return keywrite.RemoveLeftover(wctx, l.t.s.client, l.t.s.lg, other)
}

// queued takes the view from the put's answer or from the Keeper's copy.
func (l *Lock) queued(ctx context.Context, resp *clientv3.TxnResponse, mirrored bool) {
	if mirrored {
		l.t.viewFromMirror(ctx)
		return
	}
	// The page (after the puts of the key and its marker) holds the new
	// key itself, the newest under the name.
	l.t.setAhead(resp.Header.Revision, resp.Responses[2].GetResponseRange())
}

// tryEmpty puts the key only if no key is under the name. done: it was
// put (held), a blocking key was found (err wraps ErrLocked), or it
// failed; otherwise only keys that do not block were found: queue.
func (l *Lock) tryEmpty(wctx context.Context) (done bool, err error) {
	t := l.t
	resp, err := l.kw().TryPut(wctx, t.hold.value, oldestFirst(t.name()+"/"))
	if err != nil {
		return true, err
	}
	if resp.Succeeded {
		t.setToken(resp.Header.Revision)
		t.setAhead(resp.Header.Revision, nil)
		return true, nil
	}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		// A key at the own path is no other holder: enqueue sees to it.
		if string(kv.Key) != t.key && t.blocksKV(kv) {
			return true, lockedBy(kv)
		}
	}
	return false, nil
}

// setToken records the token and marks the view about to be set fresh.
// Under t.mu: watch deliveries and finish read it on other goroutines.
func (t *tracker) setToken(token int64) {
	t.mu.Lock()
	t.token = token
	t.q.SetToken(token)
	t.mu.Unlock()
}

// viewFromMirror makes the lock wait on its Keeper's copy of the queue
// once the copy has applied the lock's put, in the lock's watch epoch. The
// copy wakes only the waiters a deletion may grant, so the lock hears the
// queue watch's events through the copy alone (joinCopy).
func (t *tracker) viewFromMirror(ctx context.Context) {
	t.mu.Lock()
	epoch := t.q.Epoch()
	t.mu.Unlock()
	if !t.w.mirror().join(ctx, epoch, t, t.token, t.mode == Read) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.joinCopy(epoch) {
		t.leaveCopyLocked()
	}
}

// joinCopy moves the lock's queue subscription onto the copy
// (queue.Waiter.JoinCopy), up in epoch only, covering what the copy
// holds. It reports false if the watch has left epoch meanwhile or the
// copy is gone. t.mu is held.
func (t *tracker) joinCopy(epoch queue.Epoch) bool {
	return t.q.JoinCopy(feed{t, t.w.q()}, epoch, func() (int64, bool) {
		mv := t.w.mirror().snapshot(epoch, t.key, t.token, t.mode == Read)
		return mv.Base, mv.OK
	})
}

// leaveCopy puts a lock that waited on the copy back on the queue watch's
// events, as it reads its view: the copy is gone or the own-key watch
// restarted. What it missed meanwhile, the new subscription does not
// cover: the rule reads.
func (t *tracker) leaveCopy() {
	t.mu.Lock()
	if t.q != nil && t.q.Mirrored() { // spares a lock not on the copy a feed's allocation
		t.leaveCopyLocked()
	}
	t.mu.Unlock()
}

// leaveCopyLocked is leaveCopy with t.mu held.
func (t *tracker) leaveCopyLocked() {
	if t.q.LeaveCopy(feed{t, t.w.q()}) {
		t.w.mirror().leave(t, t.token)
	}
}

// oldestFirst reads the first page of keys under pfx, oldest first. Not
// keys-only: isQueueKey needs leases, empty in etcd 3.7 keys-only reads.
func oldestFirst(pfx string) clientv3.Op {
	return clientv3.OpGet(pfx, clientv3.WithPrefix(), clientv3.WithLimit(queuePage),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
}

// newestFirst reads up to limit keys under pfx created before maxRev (any,
// if maxRev is 0), newest first; not keys-only, as for oldestFirst.
func newestFirst(pfx string, maxRev int64, limit int64, opts ...clientv3.OpOption) clientv3.Op {
	opts = append(opts, clientv3.WithPrefix(), clientv3.WithLimit(limit),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend))
	if maxRev > 0 {
		opts = append(opts, clientv3.WithMaxCreateRev(maxRev))
	}
	return clientv3.OpGet(pfx, opts...)
}

// setAhead makes page, read at rev with the own key, the rule's snapshot
// of the older keys that block (queue.Waiter.Page); nil: no key is there.
func (t *tracker) setAhead(rev int64, page *pb.RangeResponse) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.q.Page(rev, t.ownKV(), page.GetKvs(), page.GetMore())
}
