package fence

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// MaxTxnOps is etcd's default limit on the operations (and comparisons) in
// one list of a transaction (--max-txn-ops). Commit refuses a transaction
// that would exceed it, before sending.
const MaxTxnOps = 128

// maxAttempts bounds how often Commit re-sends after finding a fence record
// missing where it expected one, or the other way round. Those attempts
// were not applied (the guard failed), so re-sending is safe.
const maxAttempts = 4

// Txn is an etcd transaction whose writes happen only if every guard holds,
// checked by etcd in the same atomic step. It is built like clientv3.Txn and
// sent by Commit in one round trip: the guards form the outer transaction,
// and the caller's If, Then and Else a transaction nested inside it.
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
//   - a failed guard runs neither branch and returns a *NotHeldError
//     (errors.Is ErrNotHeld) or a *StaleError (errors.Is ErrStale), joined
//     if several failed;
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
	missing := make([]bool, len(t.guards)) // records believed not to exist yet
	for attempt := 0; attempt < maxAttempts; attempt++ {
		cmps, then, els := t.build(missing)
		resp, err := t.kv.Txn(t.ctx).If(cmps...).Then(then...).Else(els...).Commit()
		if err != nil {
			return nil, fmt.Errorf("fence: commit: %w", classify(err))
		}
		if resp.Succeeded {
			return t.callerResponse(resp), nil
		}
		retry, err := t.diagnose(resp, missing)
		if err != nil {
			return nil, err
		}
		if !retry {
			return nil, errors.New("fence: guards failed but every guard key reads as passing")
		}
	}
	return nil, fmt.Errorf("fence: fence records kept appearing and vanishing over %d attempts", maxAttempts)
}

// nested tells whether the caller's part needs a transaction of its own.
func (t *Txn) nested() bool { return len(t.cmps) > 0 || len(t.els) > 0 }

func (t *Txn) build(missing []bool) (cmps []clientv3.Cmp, then, els []clientv3.Op) {
	for i, g := range t.guards {
		switch {
		case g.kind == heldGuard:
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(g.key), "=", g.token))
			els = append(els, clientv3.OpGet(g.key, clientv3.WithKeysOnly()))
		case missing[i]:
			// etcd fails every value comparison on a missing key, so the
			// first write is told apart by its creation revision.
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(g.key), "=", 0))
			els = append(els, clientv3.OpGet(g.key))
		default:
			// There is no "<=": value < encoded+"\x00" is value <= encoded
			// for values of one width, and cannot overflow.
			cmps = append(cmps, clientv3.Compare(clientv3.Value(g.key), "<", EncodeToken(g.token)+"\x00"))
			els = append(els, clientv3.OpGet(g.key))
		}
		if g.kind == resourceGuard {
			then = append(then, clientv3.OpPut(g.key, EncodeToken(g.token)))
		}
	}
	if t.nested() {
		then = append(then, clientv3.OpTxn(t.cmps, t.then, t.els))
	} else {
		then = append(then, t.then...)
	}
	return cmps, then, els
}

func (t *Txn) records() int {
	n := 0
	for _, g := range t.guards {
		if g.kind == resourceGuard {
			n++
		}
	}
	return n
}

func (t *Txn) callerResponse(resp *clientv3.TxnResponse) *clientv3.TxnResponse {
	rest := resp.Responses[t.records():]
	if !t.nested() {
		resp.Responses = rest
		return resp
	}
	inner := (*clientv3.TxnResponse)(rest[0].GetResponseTxn())
	inner.Header = resp.Header
	return inner
}

// diagnose reads the guard keys returned by a failed transaction. It returns
// the guards' errors, or reports that a record's existence was guessed wrong
// and the (unapplied) transaction should be sent again.
func (t *Txn) diagnose(resp *clientv3.TxnResponse, missing []bool) (retry bool, err error) {
	var errs []error
	for i, g := range t.guards {
		kvs := resp.Responses[i].GetResponseRange().Kvs
		if g.kind == heldGuard {
			switch {
			case len(kvs) == 0:
				errs = append(errs, &NotHeldError{Key: g.key, Token: g.token})
			case kvs[0].CreateRevision != g.token:
				errs = append(errs, &NotHeldError{Key: g.key, Token: g.token, Current: kvs[0].CreateRevision})
			}
			continue
		}
		if exists := len(kvs) > 0; exists == missing[i] {
			missing[i] = !exists
			retry = true
			continue
		}
		if len(kvs) == 0 {
			continue
		}
		highest, derr := DecodeToken(string(kvs[0].Value))
		switch {
		case derr != nil:
			errs = append(errs, fmt.Errorf("fence: record %q: %w", g.key, derr))
		case highest > g.token:
			errs = append(errs, &StaleError{Key: g.key, Token: g.token, Highest: highest})
		}
	}
	if len(errs) > 0 {
		return false, errors.Join(errs...)
	}
	return retry, nil
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
	outerThen := t.records() + len(t.then)
	if t.nested() {
		outerThen = t.records() + 1
	}
	for _, n := range []int{len(t.guards), outerThen, len(t.cmps), len(t.then), len(t.els)} {
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
