package fence

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/seam"
)

// MaxTxnOps is etcd's default limit on the operations (and comparisons) in
// one list of a transaction (--max-txn-ops). Commit refuses a transaction
// that would exceed it, before sending.
const MaxTxnOps = 128

// MaxResourceGuards is the most Resource guards one Txn takes. Each record
// is checked in a nested transaction with a branch for "missing" and one
// for "present", so the transaction grows as 2^n.
const MaxResourceGuards = 6

// Txn is an etcd transaction whose writes happen only if every guard holds,
// checked by etcd in the same atomic step. It is built like clientv3.Txn and
// sent by Commit as one etcd transaction, in one round trip: the Held guards
// form the outer transaction, each Resource record a nested one, and the
// caller's If, Then and Else the innermost.
//
// A Txn is not safe for concurrent use; build one per commit.
type Txn struct {
	ctx    context.Context
	kv     clientv3.KV
	guards []Guard
	cmps   []clientv3.Cmp
	then   []clientv3.Op
	els    []clientv3.Op
}

// NewTxn starts a transaction guarded by guards. ctx bounds Commit.
func NewTxn(ctx context.Context, kv clientv3.KV, guards ...Guard) *Txn {
	return &Txn{ctx: ctx, kv: kv, guards: guards}
}

// If adds comparisons of the caller's own. When they fail (and the guards
// hold), Else runs instead of Then, and Commit returns no error, as etcd
// would.
func (t *Txn) If(cmps ...clientv3.Cmp) *Txn { t.cmps = append(t.cmps, cmps...); return t }

// Then adds operations to run if the guards and the caller's If hold.
func (t *Txn) Then(ops ...clientv3.Op) *Txn { t.then = append(t.then, ops...); return t }

// Else adds operations to run if the guards hold and the caller's If fails.
func (t *Txn) Else(ops ...clientv3.Op) *Txn { t.els = append(t.els, ops...); return t }

// Commit sends the transaction. The response is that of the caller's part:
// Succeeded tells whether the caller's If held, and Responses are those of
// the branch that ran; the header is the whole transaction's.
//
// Errors:
//   - a failed guard runs neither branch and changes nothing. Failed Held
//     guards give *NotHeldError values (errors.Is ErrNotHeld), joined if
//     several failed; otherwise the first Resource guard that refused gives a
//     *StaleError (errors.Is ErrStale);
//   - when etcd may have applied the transaction without the answer
//     arriving (deadline, lost connection), an error matching
//     ErrOutcomeUnknown: Commit never re-sends such a transaction;
//   - bad input (no kv, an invalid guard, a caller operation that writes a
//     fence record, too many operations) wraps ErrInvalidArgument, and
//     nothing is sent.
func (t *Txn) Commit() (*clientv3.TxnResponse, error) {
	if err := t.validate(); err != nil {
		return nil, err
	}
	for _, g := range t.guards {
		if h, ok := g.holder.(interface{ Err() error }); ok {
			if err := h.Err(); err != nil {
				return nil, fmt.Errorf("%w: %w", &NotHeldError{Key: g.key, Token: g.token}, err)
			}
		}
	}
	if seam.From(t.ctx).Has(seam.NoFenceCompare) {
		resp, err := t.kv.Txn(t.ctx).If(t.cmps...).Then(t.then...).Else(t.els...).Commit()
		if err != nil {
			return nil, fmt.Errorf("fence: commit: %w", classify(err))
		}
		return resp, nil
	}
	cmps, then, els := t.build()
	resp, err := t.kv.Txn(t.ctx).If(cmps...).Then(then...).Else(els...).Commit()
	if err != nil {
		return nil, fmt.Errorf("fence: commit: %w", classify(err))
	}
	if !resp.Succeeded {
		return nil, t.notHeld(resp)
	}
	return t.walk(resp)
}

// nested tells whether the caller's part needs a transaction of its own.
func (t *Txn) nested() bool { return len(t.cmps) > 0 || len(t.els) > 0 }

// build lays out the transaction. The outer level compares the Held
// guards. Inside it, each Resource record i is checked by a nested
// transaction: "record missing" (etcd fails every value comparison on a
// missing key, so the first write is told apart by its creation revision)
// or else "value <= token". Both branches lead on to record i+1, and the
// innermost level, reached only when every record passed, raises the
// records and runs the caller's part. etcd evaluates every comparison of a
// transaction against the same revision before applying anything, so a
// refused write changes nothing.
func (t *Txn) build() (cmps []clientv3.Cmp, then, els []clientv3.Op) {
	for _, g := range t.guards {
		if g.kind == heldGuard {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(g.key), "=", g.token))
			els = append(els, clientv3.OpGet(g.key, clientv3.WithKeysOnly()))
		}
	}
	return cmps, t.level(t.resources()), els
}

func (t *Txn) level(recs []Guard) []clientv3.Op {
	if len(recs) == 0 {
		var ops []clientv3.Op
		for _, g := range t.resources() {
			ops = append(ops, clientv3.OpPut(g.key, EncodeToken(g.token)))
		}
		if t.nested() {
			return append(ops, clientv3.OpTxn(t.cmps, t.then, t.els))
		}
		return append(ops, t.then...)
	}
	g, next := recs[0], t.level(recs[1:])
	// There is no "<=": value < encoded+"\x00" is value <= encoded for
	// values of one width, and cannot overflow.
	present := clientv3.OpTxn(
		[]clientv3.Cmp{clientv3.Compare(clientv3.Value(g.key), "<", EncodeToken(g.token)+"\x00")},
		next,
		[]clientv3.Op{clientv3.OpGet(g.key)})
	return []clientv3.Op{clientv3.OpTxn(
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(g.key), "=", 0)},
		next,
		[]clientv3.Op{present})}
}

func (t *Txn) resources() []Guard {
	var recs []Guard
	for _, g := range t.guards {
		if g.kind == resourceGuard {
			recs = append(recs, g)
		}
	}
	return recs
}

// walk follows the branches etcd took through the record checks, down to
// the caller's part, or to the record that refused the write.
func (t *Txn) walk(resp *clientv3.TxnResponse) (*clientv3.TxnResponse, error) {
	header, rs := resp.Header, resp.Responses
	for _, g := range t.resources() {
		missing := rs[0].GetResponseTxn()
		if missing.Succeeded {
			rs = missing.Responses
			continue
		}
		present := missing.Responses[0].GetResponseTxn()
		if present.Succeeded {
			rs = present.Responses
			continue
		}
		kvs := present.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return nil, fmt.Errorf("fence: record %q vanished within one transaction", g.key)
		}
		highest, err := DecodeToken(string(kvs[0].Value))
		if err != nil {
			return nil, fmt.Errorf("fence: record %q: %w", g.key, err)
		}
		return nil, &StaleError{Key: g.key, Token: g.token, Highest: highest}
	}
	rs = rs[len(t.resources()):]
	if !t.nested() {
		return &clientv3.TxnResponse{Header: header, Succeeded: true, Responses: rs}, nil
	}
	inner := (*clientv3.TxnResponse)(rs[0].GetResponseTxn())
	inner.Header = header
	return inner, nil
}

// notHeld reads the lock keys returned by a transaction whose Held guards
// failed.
func (t *Txn) notHeld(resp *clientv3.TxnResponse) error {
	var errs []error
	i := 0
	for _, g := range t.guards {
		if g.kind != heldGuard {
			continue
		}
		kvs := resp.Responses[i].GetResponseRange().Kvs
		i++
		switch {
		case len(kvs) == 0:
			errs = append(errs, &NotHeldError{Key: g.key, Token: g.token})
		case kvs[0].CreateRevision != g.token:
			errs = append(errs, &NotHeldError{Key: g.key, Token: g.token, Current: kvs[0].CreateRevision})
		}
	}
	if len(errs) == 0 {
		return errors.New("fence: held guard failed but every lock key reads as held")
	}
	return errors.Join(errs...)
}

func (t *Txn) validate() error {
	if t.kv == nil {
		return fmt.Errorf("%w: nil etcd KV", ErrInvalidArgument)
	}
	var records [][]byte
	seen := make(map[string]bool)
	for _, g := range t.guards {
		if err := g.validate(); err != nil {
			return err
		}
		if seen[g.key] {
			return fmt.Errorf("%w: two guards on key %q", ErrInvalidArgument, g.key)
		}
		seen[g.key] = true
		if g.kind == resourceGuard {
			records = append(records, []byte(g.key))
		}
	}
	if len(records) > MaxResourceGuards {
		return fmt.Errorf("%w: %d Resource guards, at most %d per transaction", ErrInvalidArgument, len(records), MaxResourceGuards)
	}
	leaf := len(records) + len(t.then)
	if t.nested() {
		leaf = len(records) + 1
	}
	for _, n := range []int{len(t.guards), leaf, len(t.cmps), len(t.then), len(t.els)} {
		if n > MaxTxnOps {
			return fmt.Errorf("%w: %d operations in one list of a transaction, etcd accepts %d", ErrInvalidArgument, n, MaxTxnOps)
		}
	}
	for _, ops := range [][]clientv3.Op{t.then, t.els} {
		if err := checkOps(ops, records); err != nil {
			return err
		}
	}
	return nil
}

// checkOps refuses caller operations that write a fence record: only the
// guard may move it.
func checkOps(ops []clientv3.Op, records [][]byte) error {
	for _, op := range ops {
		switch {
		case op.IsTxn():
			_, then, els := op.Txn()
			if err := checkOps(then, records); err != nil {
				return err
			}
			if err := checkOps(els, records); err != nil {
				return err
			}
		case op.IsPut() || op.IsDelete():
			for _, rec := range records {
				if covers(op.KeyBytes(), op.RangeBytes(), rec) {
					return fmt.Errorf("%w: operation on %q writes fence record %q", ErrInvalidArgument, op.KeyBytes(), rec)
				}
			}
		}
	}
	return nil
}

// covers tells whether the key range [key, end) (a single key if end is
// empty, every key from key on if end is "\x00") contains k.
func covers(key, end, k []byte) bool {
	switch {
	case len(end) == 0:
		return bytes.Equal(key, k)
	case bytes.Equal(end, []byte{0}):
		return bytes.Compare(k, key) >= 0
	}
	return bytes.Compare(k, key) >= 0 && bytes.Compare(k, end) < 0
}
