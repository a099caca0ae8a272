package lease

import (
	"context"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/lease/internal/keywrite"
)

// rechecks batches the reads of their keys that held locks make as their
// own-key watches come up (recheck): with many locks held, the watches
// come up together (after a burst of grants, or when the session's watch
// stream fails and opens again), and one transaction of up to
// recheckBatch reads answers them all. A read waits for no timer: it goes
// out at once if no batch is in flight, or with the next batch, which
// leaves as the one in flight is answered.
type rechecks struct {
	s *Session

	mu      sync.Mutex
	queued  []*ownKeyRead
	sending bool // a batch is in flight; its sender sends the next
}

// ownKeyRead is one lock's read of its key, at minRev or later: its
// answer (kv nil if the key is absent) once done is closed.
type ownKeyRead struct {
	key    string
	minRev int64

	done chan struct{}
	kv   *mvccpb.KeyValue
	rev  int64
	err  error
}

// read reads key at minRev or later, batched with the reads queued beside
// it. It returns ctx's error if ctx ends first; the batch is bounded by
// the session's TTL, not by any one reader's ctx. The batches go out on a
// goroutine of the session's, which runs while any is queued.
func (r *rechecks) read(ctx context.Context, key string, minRev int64) (*mvccpb.KeyValue, int64, error) {
	q := &ownKeyRead{key: key, minRev: minRev, done: make(chan struct{})}
	r.mu.Lock()
	r.queued = append(r.queued, q)
	send := !r.sending
	r.sending = true
	r.mu.Unlock()
	if send {
		if err := r.s.track(); err != nil {
			r.failAll(err)
		} else {
			go func() {
				defer r.s.wg.Done()
				r.sendAll()
			}()
		}
	}
	select {
	case <-q.done:
		return q.kv, q.rev, q.err
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
}

// sendAll sends batches until none is queued.
func (r *rechecks) sendAll() {
	for {
		r.mu.Lock()
		n := min(len(r.queued), recheckBatch)
		if n == 0 {
			r.sending = false
			r.mu.Unlock()
			return
		}
		batch := r.queued[:n:n]
		r.queued = r.queued[n:]
		r.mu.Unlock()
		r.send(batch)
	}
}

// failAll answers every queued read with err: the session has ended.
func (r *rechecks) failAll(err error) {
	r.mu.Lock()
	queued := r.queued
	r.queued, r.sending = nil, false
	r.mu.Unlock()
	for _, q := range queued {
		q.err = err
		close(q.done)
	}
}

// send reads the batch's keys in one transaction, at the highest minRev
// of them, and answers each.
func (r *rechecks) send(batch []*ownKeyRead) {
	var minRev int64
	for _, q := range batch {
		minRev = max(minRev, q.minRev)
	}
	ctx, cancel := context.WithTimeout(r.s.ctx, r.s.ttl)
	defer cancel()
	resp, err := readAtLeast(ctx, r.s.client, minRev, func(opts ...clientv3.OpOption) []clientv3.Op {
		ops := make([]clientv3.Op, len(batch))
		for i, q := range batch {
			ops[i] = clientv3.OpGet(q.key, opts...)
		}
		return ops
	})
	for i, q := range batch {
		if q.err = err; err == nil {
			q.kv, q.rev = keywrite.FirstKV(resp.Responses[i].GetResponseRange().Kvs), resp.Header.Revision
		}
		close(q.done)
	}
}
