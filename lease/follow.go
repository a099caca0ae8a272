package lease

import (
	"context"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/lease/internal/keyread"
	"github.com/leasefence/leasefence/lease/internal/keywrite"
	"github.com/leasefence/leasefence/lease/internal/watch"
)

// startFollowWatch starts a watch of key, a queue key ahead of one of the
// session's locks. It keeps puts: one that moves the key off its lease
// makes it no lock, which the waiter must hear as it hears a deletion.
func (s *Session) startFollowWatch(key string) (*watch.Watch, error) {
	return s.startWatch(key, false, false)
}

// follow starts following the newest keys ahead of a far waiter: once
// their watches are up it reads the keys, as a deletion before then went
// unseen, and a put since the view may have changed one. A key found gone
// counts as deleted; one that no longer blocks is dropped.
func (t *tracker) follow(ctx context.Context) error {
	t.mu.Lock()
	keys := t.q.FollowKeys()
	minRev := t.q.FollowFloor(keys)
	t.mu.Unlock()
	fl := t.w.followsFor(t.s.startFollowWatch)
	if fl == nil {
		return context.Cause(t.s.ctx) // the gate's watches stopped: the session ended
	}
	epochs, upRev, err := fl.Ensure(ctx, t, keys)
	if err != nil {
		return err
	}
	resp, err := keyread.ReadAtLeast(ctx, t.s.client, max(minRev, upRev), func(opts ...clientv3.OpOption) []clientv3.Op {
		ops := make([]clientv3.Op, len(keys))
		for i, k := range keys {
			ops[i] = clientv3.OpGet(k, opts...)
		}
		return ops
	})
	if err != nil {
		return err
	}
	kvs := make([]*mvccpb.KeyValue, len(keys))
	for i := range keys {
		kvs[i] = keywrite.FirstKV(resp.Responses[i].GetResponseRange().Kvs)
	}
	t.mu.Lock()
	t.q.Followed(resp.Header.Revision, keys, kvs, epochs)
	t.mu.Unlock()
	return nil
}

// rereadFar reads a far waiter's view again after a key it followed went,
// with the queue watch up. Usually the waiter is then second, behind the
// new holder, and the queue watch delivers that holder's deletion in order
// with any change of the own key: the grant needs no read after it, where
// the follow watch of that key alone would need one of the own key, a
// round trip on the handoff's path, provided the watch is up and the view
// read before the new holder releases, as it usually is. The read is of
// the older keys keys-only (served from etcd 3.7's index), and in full
// only if that shows keys the waiter does not know or that changed since
// it read them (relist). A view that shows it still far sends it back to
// following (look), pausing the queue watch.
func (t *tracker) rereadFar(ctx context.Context) error {
	t.mu.Lock()
	t.q.FarDone()
	t.mu.Unlock()
	epoch, err := t.queueUp(ctx)
	if err != nil {
		return err
	}
	ownEpoch, err := t.w.own.UpEpoch(ctx, t)
	if err != nil {
		return err
	}
	pfx := t.name() + "/"
	older, rev, err := t.readWithOwn(ctx, ownEpoch, epoch, 0, func(opts ...clientv3.OpOption) clientv3.Op {
		return clientv3.OpGet(pfx, append(opts, clientv3.WithPrefix(),
			clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(t.token-1), clientv3.WithLimit(queuePage))...)
	})
	if err != nil {
		return err
	}
	if older.More || !t.relist(rev, older.Kvs) {
		return t.readView(ctx, ownEpoch, epoch, 0)
	}
	return nil
}

// relist makes kvs, a keys-only read at rev of the keys older than the
// lock's own, the rule's snapshot if it shows nothing the waiter does not
// know (queue.Waiter.Relist), and otherwise reports false.
func (t *tracker) relist(rev int64, kvs []*mvccpb.KeyValue) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.q.Relist(rev, t.ownKV(), kvs)
}
