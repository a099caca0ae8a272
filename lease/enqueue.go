package lease

import (
	"context"
	"errors"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/lease/internal/queue"
)

// queue puts the key with requests that end with the session too: a
// waiter whose lease is gone must not sit in a request until ctx ends.
func (l *Lock) queue(ctx context.Context, try bool) error {
	cctx, stop := l.s.bound(ctx)
	err := l.create(cctx, try)
	stop()
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// etcd knows the lease is gone before the keep-alives told the
		// session: end it, so that this call and every later one say so.
		l.s.lose("etcd refused a put on the lease: lease not found")
	}
	if err != nil && l.s.ctx.Err() != nil {
		err = context.Cause(l.s.ctx)
	}
	return err
}

// lockedBy is TryLock's error when kv holds the lock.
func lockedBy(kv *mvccpb.KeyValue) error {
	return fmt.Errorf("%w: %s (token %d)", ErrLocked, kv.Key, kv.CreateRevision)
}

// page is how many keys ahead the lock's reads return.
func (l *Lock) page() int64 {
	if l.w.shared != nil {
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
	wctx, stop := linkCause(context.WithoutCancel(ctx), l.s.ctx)
	err := l.enqueue(ctx, wctx, try)
	stop()
	if err == nil && l.token != 0 && ctx.Err() != nil {
		l.cleanup()
		return ctx.Err()
	}
	return err
}

// enqueue is create's work: its writes use wctx, its waits ctx.
func (l *Lock) enqueue(ctx, wctx context.Context, try bool) error {
	if try {
		if done, err := l.tryEmpty(wctx); done || err != nil {
			return err
		}
		// Only keys that do not block were seen: queue, then look again.
	}
	// A paused Keeper's watch (keyWatch.granted) keeps no copy: read.
	mirrored := !try && l.w.queue.mirror != nil && !l.w.queue.isPaused()
	var reads []clientv3.Op
	if !mirrored {
		reads = append(reads, newestFirst(l.name+"/", 0, l.page()+1))
	}
	for tries := 0; ; tries++ {
		resp, err := l.kw.put(wctx, l.hold.value, reads...)
		if err != nil {
			return err
		}
		if resp.Succeeded {
			l.setToken(resp.Header.Revision)
			l.s.probeKey.Store(l.key)
			l.s.sawRevision(resp.Header.Revision)
			l.queued(ctx, resp, mirrored)
			return nil
		}
		if err := l.notPut(wctx, resp, tries); err != nil {
			return err
		}
	}
}

// notPut sees to what kept enqueue's put from applying, so that it may
// try again (keyWrites.notPut): it removes a key at the lock's own path
// that someone else's put moved off the session's lease, which is no lock.
func (l *Lock) notPut(wctx context.Context, resp *clientv3.TxnResponse, tries int) error {
	key, marker := readsOf(resp.Responses)
	again, other, err := l.kw.notPut(wctx, key, marker)
	switch {
	case err != nil:
		return err
	case tries >= putTries:
		return fmt.Errorf("%w: %s: the put kept failing", ErrKeyInUse, l.key)
	case again:
		return nil
	}
	return l.s.removeLeftover(wctx, other)
}

// queued takes the view from the put's answer or from the Keeper's copy.
func (l *Lock) queued(ctx context.Context, resp *clientv3.TxnResponse, mirrored bool) {
	if mirrored {
		l.viewFromMirror(ctx)
		return
	}
	// The page (after the puts of the key and its marker) holds the new
	// key itself, the newest under the name.
	l.setAhead(resp.Header.Revision, resp.Responses[2].GetResponseRange())
}

// tryEmpty puts the key only if no key is under the name. done: it was
// put (held), a blocking key was found (err wraps ErrLocked), or it
// failed; otherwise only keys that do not block were found: queue.
func (l *Lock) tryEmpty(wctx context.Context) (done bool, err error) {
	resp, err := l.kw.tryPut(wctx, l.hold.value, oldestFirst(l.name+"/"))
	if err != nil {
		return true, err
	}
	if resp.Succeeded {
		l.setToken(resp.Header.Revision)
		l.setAhead(resp.Header.Revision, nil)
		return true, nil
	}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		// A key at the own path is no other holder: enqueue sees to it.
		if string(kv.Key) != l.key && l.blocksKV(kv) {
			return true, lockedBy(kv)
		}
	}
	return false, nil
}

// setToken records the token and marks the view about to be set fresh.
// Under l.mu: watch deliveries and finish read it on other goroutines.
func (l *Lock) setToken(token int64) {
	l.mu.Lock()
	l.token = token
	l.q.SetToken(token)
	l.mu.Unlock()
}

// viewFromMirror makes the lock wait on its Keeper's copy of the queue
// once the copy has applied the lock's put, in the lock's watch epoch. The
// copy wakes only the waiters a deletion may grant, so the lock hears the
// queue watch's events through the copy alone (joinCopy).
func (l *Lock) viewFromMirror(ctx context.Context) {
	l.mu.Lock()
	epoch := l.q.Epoch()
	l.mu.Unlock()
	if !l.w.queue.mirror.join(ctx, epoch, l, l.token, l.mode == Read) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.joinCopy(epoch) {
		l.leaveCopyLocked()
	}
}

// joinCopy moves the lock's queue subscription onto the copy
// (queue.Waiter.JoinCopy), up in epoch only, covering what the copy
// holds. It reports false if the watch has left epoch meanwhile or the
// copy is gone. l.mu is held.
func (l *Lock) joinCopy(epoch queue.Epoch) bool {
	w := l.w.queue
	return l.q.JoinCopy(feed{l, w}, epoch, func() (int64, bool) {
		mv := w.mirror.snapshot(epoch, l.key, l.token, l.mode == Read)
		return mv.Base, mv.OK
	})
}

// leaveCopy puts a lock that waited on the copy back on the queue watch's
// events, as it reads its view: the copy is gone or the own-key watch
// restarted. What it missed meanwhile, the new subscription does not
// cover: the rule reads.
func (l *Lock) leaveCopy() {
	l.mu.Lock()
	if l.q.Mirrored() { // spares a lock not on the copy a feed's allocation
		l.leaveCopyLocked()
	}
	l.mu.Unlock()
}

// leaveCopyLocked is leaveCopy with l.mu held.
func (l *Lock) leaveCopyLocked() {
	if l.q.LeaveCopy(feed{l, l.w.queue}) {
		l.w.queue.mirror.leave(l, l.token)
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
func (l *Lock) setAhead(rev int64, page *pb.RangeResponse) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.q.Page(rev, l.ownKV(), page.GetKvs(), page.GetMore())
}
