package keyread

import (
	"context"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Batcher batches the reads of their keys that held locks make as their
// own-key watches come up: with many locks held, the watches come up
// together (after a burst of grants, or when the watch stream fails and
// opens again), and one transaction of up to Max reads answers them all.
// A read waits for no timer: it goes out at once if fewer than
// MaxInFlight batches are in flight, or else with the next batch, which
// leaves as one in flight is answered; so a batch etcd does not answer
// holds up only its own reads. The caller does not wait: its answer
// comes to a function.
type Batcher struct {
	Client *clientv3.Client
	// Max is the most reads in one transaction; etcd refuses a
	// transaction of more than --max-txn-ops operations.
	Max int
	// MaxInFlight is the most batches sent and not yet answered.
	MaxInFlight int
	// Ctx and Timeout bound each batch: the batch is not any one
	// reader's, so no reader's context ends it.
	Ctx     context.Context
	Timeout time.Duration
	// Go runs f on a goroutine its owner waits for, or returns why it
	// cannot (the owner has ended).
	Go func(f func()) error

	mu      sync.Mutex
	queued  []*read
	senders int // goroutines sending batches, each one at a time
}

// read is one lock's read of its key, at minRev or later.
type read struct {
	key    string
	minRev int64
	answer Answer
}

// Answer takes a read's answer: the key (nil if absent) and the revision
// read, or why the read failed.
type Answer func(kv *mvccpb.KeyValue, rev int64, err error)

// Read reads key at minRev or later, batched with the reads queued beside
// it, and calls answer with the outcome: on the batch's goroutine, or on
// the caller's at once if the batch cannot start (Go failed; then every
// read queued is failed with it). A batch is bounded by Timeout, so
// answer is called within about twice that: the batch's own time, and at
// most one batch's before it leaves.
func (b *Batcher) Read(key string, minRev int64, answer Answer) {
	b.mu.Lock()
	b.queued = append(b.queued, &read{key: key, minRev: minRev, answer: answer})
	send := b.senders < b.MaxInFlight
	if send {
		b.senders++
	}
	b.mu.Unlock()
	if send {
		if err := b.Go(b.sendAll); err != nil {
			b.mu.Lock()
			b.senders--
			b.mu.Unlock()
			b.failAll(err)
		}
	}
}

// sendAll sends batches, one at a time, until none is queued.
func (b *Batcher) sendAll() {
	for {
		b.mu.Lock()
		n := min(len(b.queued), b.Max)
		if n == 0 {
			b.senders--
			b.mu.Unlock()
			return
		}
		batch := b.queued[:n:n]
		b.queued = b.queued[n:]
		if len(b.queued) == 0 {
			// Let the array go with the last batch taken from it: kept,
			// it would keep the reads already answered (their answers,
			// and what those hold) for as long as later reads reuse it.
			// After a burst of 10,000 grants that was 42 bytes a lock.
			b.queued = nil
		}
		b.mu.Unlock()
		b.send(batch)
	}
}

// failAll answers every queued read with err.
func (b *Batcher) failAll(err error) {
	b.mu.Lock()
	queued := b.queued
	b.queued = nil
	b.mu.Unlock()
	for _, q := range queued {
		q.answer(nil, 0, err)
	}
}

// send reads the batch's keys in one transaction, at the highest minRev
// of them, and answers each.
func (b *Batcher) send(batch []*read) {
	var minRev int64
	for _, q := range batch {
		minRev = max(minRev, q.minRev)
	}
	ctx, cancel := context.WithTimeout(b.Ctx, b.Timeout)
	defer cancel()
	resp, err := ReadAtLeast(ctx, b.Client, minRev, func(opts ...clientv3.OpOption) []clientv3.Op {
		ops := make([]clientv3.Op, len(batch))
		for i, q := range batch {
			ops[i] = clientv3.OpGet(q.key, opts...)
		}
		return ops
	})
	for i, q := range batch {
		if err != nil {
			q.answer(nil, 0, err)
			continue
		}
		var kv *mvccpb.KeyValue
		if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) > 0 {
			kv = kvs[0]
		}
		q.answer(kv, resp.Header.Revision, nil)
	}
}
