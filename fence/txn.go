package fence

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MaxTxnOps is etcd's default limit on the operations (and comparisons) in
// one list of a transaction (--max-txn-ops). The guards take part of it,
// and Commit refuses a transaction that would exceed it before sending:
// how many operations of the caller's fit depends on the guards (see Txn).
const MaxTxnOps = 128

// MaxResourceGuards is the most Resource guards (Claims included) one Txn
// takes.
const MaxResourceGuards = 16

// Txn is an etcd transaction whose writes happen only if every guard holds,
// checked by etcd in the same atomic step. It is built like clientv3.Txn and
// sent by Commit. The caller's part runs at most once, in the same atomic
// step as the checks of every guard, even when Commit needs a second
// request to decide (the first then wrote nothing).
//
// Besides the caller's part, a transaction writes only its fence records,
// each to its guard's token, and only if every guard holds: a Claim's
// always; a Resource guard's when the record was missing or below the
// token, or when the caller's part writes, then possibly with the value
// the record already holds (watch a record's value, not its revision). A
// Recorder's guards, after their first write with a token, leave the
// record alone. A transaction whose caller's part writes nothing, with
// every record at its token and no Claim, writes nothing.
//
// The guards use part of etcd's allowance of MaxTxnOps operations. With h
// Held and r > 0 Resource guards, and no If or Else of the caller's, Then
// takes up to MaxTxnOps - (2h + r) - 2r operations (123 for one Held and
// one Resource guard); with Held guards alone, MaxTxnOps. Commit refuses a
// larger transaction, the caller's own nested transactions counted, with
// ErrInvalidArgument before sending it. Keep within that allowance with a
// Recorder too: a write larger than it may go through while the
// Recorder's records hold its tokens, and is refused as too large, having
// changed nothing, once one does not.
//
// A Txn is not safe for concurrent use; build one per commit.
type Txn struct {
	ctx    context.Context
	kv     clientv3.KV
	guards []Guard
	recs   []Guard // the Resource guards, in order (set by validate)
	cmps   []clientv3.Cmp
	then   []clientv3.Op
	els    []clientv3.Op
	hooks  *Hooks
}

// NewTxn starts a transaction guarded by guards. ctx bounds Commit.
func NewTxn(ctx context.Context, kv clientv3.KV, guards ...Guard) *Txn {
	return &Txn{ctx: ctx, kv: kv, guards: guards}
}

// WithHooks reports the transaction's verdict to h: a refusal by a Held
// guard as "held", by a Resource guard as "resource", and an unknown
// outcome. Bad input is not counted as a refusal; Hooks.Write hears every
// Commit, bad input and all.
func (t *Txn) WithHooks(h *Hooks) *Txn { t.hooks = h; return t }

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
//   - a ctx that had already ended sends nothing, and the error wraps its
//     cause (for a lock's context, the lock's Err). Fenced writes under a
//     lock are best given lease.Lock.WriteContext, which does not end with
//     the lock, so that a late write gets the fence's verdict;
//   - bad input (no kv, an invalid guard, a caller operation that writes a
//     fence record, too many operations) wraps ErrInvalidArgument, and
//     nothing is sent.
func (t *Txn) Commit() (*clientv3.TxnResponse, error) {
	given := t.ctx
	ctx, done := t.hooks.Begin(given, "etcd", "resource", t.traced)
	// This Commit's requests carry the hooks' context; a later Commit of
	// the same Txn starts again from the one NewTxn was given.
	t.ctx = ctx
	resp, err := t.commit()
	t.ctx = given
	done(err)
	return resp, err
}

// traced describes the guards for Hooks.Write.
func (t *Txn) traced() []WriteGuard {
	gs := make([]WriteGuard, len(t.guards))
	for i, g := range t.guards {
		gs[i] = WriteGuard{Kind: g.kindName(), Key: g.key, Token: g.token}
	}
	return gs
}

func (t *Txn) commit() (*clientv3.TxnResponse, error) {
	if err := t.validate(); err != nil {
		return nil, err
	}
	if err := t.holdersEnded(); err != nil {
		return nil, err
	}
	// A one-level shape first (onelevel.go): building the full one would
	// cost a holder's every write most of the client's share of it, and
	// etcd more than its nesting is worth.
	if len(t.resources()) > 0 {
		steady := t.steady()
		if steady || t.fullFits() {
			if resp, done, err := t.commitOneLevel(!steady && (t.callerWrites() || t.claims())); done {
				return resp, err
			}
		}
	}
	cmps, then, els := t.build()
	if err := fits(cmps, then, els, MaxTxnOps); err != nil {
		return nil, err
	}
	if err := t.ended(); err != nil {
		return nil, err
	}
	resp, err := t.kv.Txn(t.ctx).If(cmps...).Then(then...).Else(els...).Commit()
	if err != nil {
		return nil, classify(err)
	}
	if !resp.Succeeded {
		return nil, t.notHeld(resp)
	}
	resp, err = t.walk(resp)
	if err == nil {
		t.noteRecorded()
	}
	return resp, err
}

// holdersEnded is the error of a Held guard whose holder already knows
// it has ended: nothing is sent for it.
func (t *Txn) holdersEnded() error {
	for _, g := range t.guards {
		if g.kind == heldGuard {
			if err := Ended(g.holder); err != nil {
				return &NotHeldError{Key: g.key, Token: g.token, Cause: err}
			}
		}
	}
	return nil
}

// ended is the error of a transaction whose ctx has ended: known not
// applied, since the client sends nothing on an ended context.
func (t *Txn) ended() error {
	if t.ctx.Err() != nil {
		return fmt.Errorf("fence: not sent: %w", context.Cause(t.ctx))
	}
	return nil
}

// nested tells whether the caller's part needs a transaction of its own.
func (t *Txn) nested() bool { return len(t.cmps) > 0 || len(t.els) > 0 }

// build lays out the transaction. The outer level compares the Held
// guards. Inside it, each Resource record is checked by one nested
// transaction: "record above token" runs a read of the record, the write
// is refused; otherwise (the record is not above the token, or missing:
// etcd fails every value comparison on a missing key) its Else leads on to
// the next record. The innermost level, reached only when every record
// passed, raises the records that are below the token (raise) and runs the
// caller's part. etcd evaluates every comparison of a transaction against
// the same revision before applying anything, so a refused write changes
// nothing. Each record costs one level, so the shape grows linearly with
// the guards. It is sent only when a one-level shape (oneLevel) could not
// decide.
func (t *Txn) build() (cmps []clientv3.Cmp, then, els []clientv3.Op) {
	cmps, els = t.heldChecks()
	for _, g := range t.resources() {
		cmps = append(cmps, unleased(g.key))
		els = append(els, clientv3.OpGet(g.key))
	}
	return cmps, t.level(t.resources()), els
}

// heldChecks are the Held guards' comparisons, and the reads of their lock
// keys that say, when one fails, which (heldFailures reads them).
func (t *Txn) heldChecks() (cmps []clientv3.Cmp, reads []clientv3.Op) {
	for _, g := range t.guards {
		if g.kind == heldGuard {
			// The read is not keys-only, which on etcd 3.7 leaves the
			// lease out.
			cmps = append(cmps, heldCmps(g.key, g.token)...)
			reads = append(reads, clientv3.OpGet(g.key))
		}
	}
	return cmps, reads
}

// caller is the caller's part of the transaction: its Then, or its whole
// If/Then/Else as a transaction of its own.
func (t *Txn) caller() []clientv3.Op {
	if t.nested() {
		return []clientv3.Op{clientv3.OpTxn(t.cmps, t.then, t.els)}
	}
	return t.then
}

// callerPart is the answer to the caller's part, from its responses.
func (t *Txn) callerPart(header *pb.ResponseHeader, rs []*pb.ResponseOp) *clientv3.TxnResponse {
	if !t.nested() {
		return &clientv3.TxnResponse{Header: header, Succeeded: true, Responses: rs}
	}
	inner := (*clientv3.TxnResponse)(rs[0].GetResponseTxn())
	inner.Header = header
	return inner
}

func (t *Txn) level(recs []Guard) []clientv3.Op {
	if len(recs) == 0 {
		var ops []clientv3.Op
		for _, g := range t.resources() {
			ops = append(ops, raise(g))
		}
		return append(ops, t.caller()...)
	}
	g := recs[0]
	// Tokens are encoded at one width, so byte order is numeric order.
	return []clientv3.Op{clientv3.OpTxn(
		[]clientv3.Cmp{clientv3.Compare(clientv3.Value(g.key), ">", EncodeToken(g.token))},
		[]clientv3.Op{clientv3.OpGet(g.key)},
		t.level(recs[1:]))}
}

// raise sets a record to the guard's token unless it already holds it:
// in the steady state (a holder's every write after its first) the
// transaction writes the caller's keys and nothing else. Its comparison,
// like every one in the transaction, is evaluated before anything is
// applied.
func raise(g Guard) clientv3.Op {
	enc := EncodeToken(g.token)
	return clientv3.OpTxn(
		[]clientv3.Cmp{clientv3.Compare(clientv3.Value(g.key), "=", enc)},
		nil,
		[]clientv3.Op{clientv3.OpPut(g.key, enc)})
}

// resources are the transaction's Resource guards, in order.
func (t *Txn) resources() []Guard { return t.recs }

// walk follows the branches etcd took through the record checks, down to
// the caller's part, or to the record that refused the write.
func (t *Txn) walk(resp *clientv3.TxnResponse) (*clientv3.TxnResponse, error) {
	header, rs := resp.Header, resp.Responses
	for _, g := range t.resources() {
		check := rs[0].GetResponseTxn()
		if !check.Succeeded {
			rs = check.Responses
			continue
		}
		kvs := check.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return nil, fmt.Errorf("%w: record %q refused the write but read as missing", ErrStale, g.key)
		}
		highest, err := DecodeToken(string(kvs[0].Value))
		if err != nil {
			return nil, fmt.Errorf("%w (record %q refused the write)", err, g.key)
		}
		return nil, &StaleError{Key: g.key, Token: g.token, Highest: highest}
	}
	return t.callerPart(header, rs[len(t.resources()):]), nil
}

// fits checks a transaction's shape against etcd's limit as etcd does
// (checkTxnRequest): each level's longest list within its allowance, and
// each nested transaction within what its level leaves.
func fits(cmps []clientv3.Cmp, then, els []clientv3.Op, allowance int) error {
	n := max(len(cmps), len(then), len(els))
	if n > allowance {
		return fmt.Errorf("%w: a list of %d operations where etcd allows %d at that depth (MaxTxnOps %d, less what the guards and enclosing levels use)",
			ErrInvalidArgument, n, allowance, MaxTxnOps)
	}
	for _, ops := range [][]clientv3.Op{then, els} {
		for _, op := range ops {
			if op.IsTxn() {
				c, th, el := op.Txn()
				if err := fits(c, th, el, allowance-n); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// notHeld reads the lock keys returned by a transaction whose Held guards
// failed.
func (t *Txn) notHeld(resp *clientv3.TxnResponse) error {
	if err := t.heldFailures(resp); err != nil {
		return err
	}
	recs := t.resources()
	if err := leased(recs, resp.Responses[len(resp.Responses)-len(recs):]); err != nil {
		return err
	}
	return fmt.Errorf("%w: a Held guard failed, yet every lock key reads as held", ErrNotHeld)
}

// heldFailures reads the lock keys at the head of resp's responses and
// says which Held guards no longer hold; nil if all do.
func (t *Txn) heldFailures(resp *clientv3.TxnResponse) error {
	var errs []error
	i := 0
	for _, g := range t.guards {
		if g.kind != heldGuard {
			continue
		}
		kvs := resp.Responses[i].GetResponseRange().Kvs
		i++
		id, _ := KeyLease(g.key) // validate refused keys that encode no lease
		switch {
		case len(kvs) == 0:
			errs = append(errs, &NotHeldError{Key: g.key, Token: g.token})
		case kvs[0].CreateRevision != g.token:
			errs = append(errs, &NotHeldError{Key: g.key, Token: g.token, Current: kvs[0].CreateRevision})
		case kvs[0].Lease != id:
			errs = append(errs, &NotHeldError{Key: g.key, Token: g.token, Current: g.token, Detached: true})
		}
	}
	return errors.Join(errs...)
}

func (t *Txn) validate() error {
	if t.kv == nil {
		return fmt.Errorf("%w: nil etcd KV", ErrInvalidArgument)
	}
	if len(t.guards) == 0 {
		return fmt.Errorf("%w: a Txn with no guard would commit unfenced: give Held, Resource or Claim (or use clientv3's own Txn)", ErrInvalidArgument)
	}
	var records [][]byte
	t.recs = nil
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
			t.recs = append(t.recs, g)
		}
	}
	if len(records) > MaxResourceGuards {
		return fmt.Errorf("%w: %d Resource guards, at most %d per transaction", ErrInvalidArgument, len(records), MaxResourceGuards)
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
