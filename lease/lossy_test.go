package lease_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fate is what a lossyKV does with one transaction.
type fate int

const (
	pass       fate = iota // sent, answered
	loseAnswer             // sent and applied; the caller hears Unavailable
	hold                   // the caller hears Unavailable; sent when replayed
	overloaded             // refused unsent, as etcd refuses "too many requests"
)

// lossyKV sends a session's writes of its lock keys (lease.SetKeys) to a
// real etcd, losing answers of applied transactions, holding others back
// to apply them later, as a proposal a follower forwarded late is, or
// refusing them as an overloaded etcd does:
// the faults the marker rules are for. decide picks each transaction's
// fate, in the order they are committed, and may write to etcd first.
type lossyKV struct {
	clientv3.KV
	decide func(n int, t *heldTxn) fate

	mu   sync.Mutex
	n    int
	held []*heldTxn
	// counts, for the write model's report: answers lost, requests held
	// back, and of those replayed the ones whose Then applied.
	lost, heldBack, lateApplied int
}

// heldTxn is one transaction as the session built it.
type heldTxn struct {
	kv         *lossyKV
	cmps       []clientv3.Cmp
	then, els  []clientv3.Op
	thenDelete bool // its Then deletes a key
}

func (k *lossyKV) Txn(context.Context) clientv3.Txn { return &heldTxn{kv: k} }

// commits is how many transactions have been committed through k.
func (k *lossyKV) commits() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.n
}

func (t *heldTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.cmps = append(t.cmps, cs...)
	return t
}

func (t *heldTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.then = append(t.then, ops...)
	for _, op := range ops {
		t.thenDelete = t.thenDelete || op.IsDelete()
	}
	return t
}

func (t *heldTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.els = append(t.els, ops...)
	return t
}

const testTimeout = 30 * time.Second

var errAnswerLost = status.Error(codes.Unavailable, "lossyKV: answer lost")

func (t *heldTxn) Commit() (*clientv3.TxnResponse, error) {
	k := t.kv
	k.mu.Lock()
	n := k.n
	k.n++
	k.mu.Unlock()
	switch k.decide(n, t) {
	case loseAnswer:
		t.send()
		k.mu.Lock()
		k.lost++
		k.mu.Unlock()
		return nil, errAnswerLost
	case hold:
		k.mu.Lock()
		k.held = append(k.held, t)
		k.heldBack++
		k.mu.Unlock()
		return nil, errAnswerLost
	case overloaded:
		return nil, rpctypes.ErrGRPCRequestTooManyRequests
	}
	return t.send()
}

// send applies the transaction to etcd.
func (t *heldTxn) send() (*clientv3.TxnResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	return t.kv.KV.Txn(ctx).If(t.cmps...).Then(t.then...).Else(t.els...).Commit()
}

// replay applies every held transaction, oldest first, and reports how
// many of them applied their Then.
func (k *lossyKV) replay(tb testing.TB) (applied int) {
	tb.Helper()
	k.mu.Lock()
	held := k.held
	k.held = nil
	k.mu.Unlock()
	for _, t := range held {
		resp, err := t.send()
		if err != nil {
			tb.Fatalf("replaying a held transaction: %v", err)
		}
		if resp.Succeeded {
			applied++
		}
	}
	k.mu.Lock()
	k.lateApplied += applied
	k.mu.Unlock()
	return applied
}
