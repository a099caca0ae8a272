package fence

import (
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The one-level shapes carry the caller's part with no nested transaction
// of the guards' own. They are tried before the full shape (build), which
// nests one level per record: on etcd 3.7 any nesting in a request costs
// the server about 15 us (it marshals the request into its raft entry
// through protobuf's reflection, slow for nested requests), and made a
// Resource guard's steady write 1.21x a Held guard's; at one level it is
// 1.06x (BenchmarkTxnShapes, BenchmarkGuardedPut). A one-level shape has
// two outcomes where the full shape has three (write, raise the record
// and write, refuse), so each gives up one case to the full shape, sent
// as a second round trip:
//   - the compare-only shape (a Recorder that knows its record holds the
//     token, or a caller's part that writes nothing: callerWrites) writes
//     only if every record equals its token, and writes no record; a
//     record below its token takes the full shape;
//   - the raising shape, for a caller's part that writes, writes if every
//     record is at most its token, and sets every record to its token in
//     the same step (in the steady state a rewrite of the
//     same value: cheaper than the nesting that would skip it, measured
//     on etcd 3.5 as on 3.7). etcd fails every value comparison on a
//     missing key, so a record that was never written takes the full
//     shape: a record's first write is two round trips, a new holder's
//     first write to an existing record one.

// oneLevel lays out a one-level shape: the Held guards' comparisons and
// one comparison per record, then (when raise) the records set to their
// tokens and the caller's part, and reads of the lock keys and the records
// in Else, which say what failed.
func (t *Txn) oneLevel(raise bool) (cmps []clientv3.Cmp, then, els []clientv3.Op) {
	cmps, els = t.heldChecks()
	for _, g := range t.resources() {
		enc := EncodeToken(g.token)
		if raise {
			// No value sorts between enc and enc+"\x00", so "below
			// enc+\x00" is "at most enc": at most the token, since tokens
			// are encoded at one width and byte order is numeric order.
			// A lock key's value (empty, say) is below it too: only the
			// lease comparison keeps the put from taking the key over.
			cmps = append(cmps, clientv3.Compare(clientv3.Value(g.key), "<", enc+"\x00"), unleased(g.key))
			then = append(then, clientv3.OpPut(g.key, enc))
		} else {
			// A leased key holding a token's encoding is still no record.
			cmps = append(cmps, clientv3.Compare(clientv3.Value(g.key), "=", enc), unleased(g.key))
		}
		els = append(els, clientv3.OpGet(g.key))
	}
	return cmps, append(then, t.caller()...), els
}

// commitOneLevel sends a one-level shape. done is false if nothing the
// caller must hear happened: the shape does not fit etcd's limits (nothing
// was sent), or it was refused for a case it gives up (a record missing,
// below its token for the steady shape, or not a token this package
// wrote), having written nothing; the full shape must then decide. A
// Recorder forgets what it knew of a record found so.
func (t *Txn) commitOneLevel(raise bool) (resp *clientv3.TxnResponse, done bool, err error) {
	cmps, then, els := t.oneLevel(raise)
	if fits(cmps, then, els, MaxTxnOps) != nil {
		return nil, false, nil
	}
	if err := t.ended(); err != nil {
		return nil, true, err
	}
	r, err := t.kv.Txn(t.ctx).If(cmps...).Then(then...).Else(els...).Commit()
	if err != nil {
		return nil, true, classify(err)
	}
	recs := t.resources()
	if r.Succeeded {
		caller := r.Responses
		if raise {
			caller = caller[len(recs):] // after the records' puts
			t.noteRecorded()
		}
		return t.callerPart(r.Header, caller), true, nil
	}
	if err := t.heldFailures(r); err != nil {
		return nil, true, err
	}
	held := len(els) - len(recs) // the records' reads follow the lock keys'
	if err := leased(recs, r.Responses[held:]); err != nil {
		return nil, true, err
	}
	for i, g := range recs {
		kvs := r.Responses[held+i].GetResponseRange().Kvs
		if len(kvs) == 0 {
			g.forget()
			continue
		}
		highest, err := DecodeToken(string(kvs[0].Value))
		switch {
		case err == nil && highest > g.token:
			return nil, true, &StaleError{Key: g.key, Token: g.token, Highest: highest}
		case err != nil || highest < g.token:
			g.forget() // the full shape decides
		}
	}
	return nil, false, nil
}

// fullFits tells whether the full shape fits etcd's limits. A one-level
// shape is tried (a Recorder's steady one aside) only for a transaction
// that the full shape can carry too, so that whether it is too large
// never depends on what etcd holds. A
// caller's part without transactions of its own is checked against the
// documented allowance; one with them is laid out and measured.
func (t *Txn) fullFits() bool {
	if !t.nested() && !hasTxn(t.then) {
		r := len(t.resources())
		h := len(t.guards) - r
		return len(t.then) <= MaxTxnOps-max(2*h+r, 1)-2*r
	}
	cmps, then, els := t.build()
	return fits(cmps, then, els, MaxTxnOps) == nil
}

// noteRecorded tells the transaction's Recorders that their records now
// hold their tokens.
func (t *Txn) noteRecorded() {
	for _, g := range t.resources() {
		if g.rec != nil {
			g.rec.note(g.token)
		}
	}
}

// callerWrites tells whether the caller's part may write: only then, and
// unless the Recorders know their records hold the tokens (steady), is
// the raising shape sent. A transaction that writes anyway takes the
// record's rewrite into the revision it makes; a check alone (or with
// reads) would make a revision of its own with every call, where the
// compare-only shape writes nothing in either branch, so that etcd serves
// it as a linearizable read: no raft entry, no fsync.
func (t *Txn) callerWrites() bool { return writes(t.then) || writes(t.els) }

// claims tells whether a guard is a Claim, which raises its record even
// when the caller's part writes nothing.
func (t *Txn) claims() bool {
	for _, g := range t.resources() {
		if g.claim {
			return true
		}
	}
	return false
}

// unleased is the comparison that keeps a record's write off a key
// attached to a lease: a lock key, whose value a raise would replace,
// dropping its lease, with nothing telling the lock. A missing key has
// lease 0 and passes.
func unleased(key string) clientv3.Cmp {
	return clientv3.Compare(clientv3.LeaseValue(key), "=", 0)
}

// leased is the error for the first record, read in full in reads, that is
// attached to a lease; nil if none is.
func leased(recs []Guard, reads []*pb.ResponseOp) error {
	for i, g := range recs {
		kvs := reads[i].GetResponseRange().Kvs
		if len(kvs) > 0 && kvs[0].Lease != 0 {
			return fmt.Errorf("%w: %q is attached to lease %x: a key with a lease (a lock key, say) is never a fence record", ErrBadRecord, g.key, kvs[0].Lease)
		}
	}
	return nil
}

// writes tells whether ops holds a put or a delete, at any depth.
func writes(ops []clientv3.Op) bool {
	for _, op := range ops {
		switch {
		case op.IsPut(), op.IsDelete():
			return true
		case op.IsTxn():
			if _, then, els := op.Txn(); writes(then) || writes(els) {
				return true
			}
		}
	}
	return false
}

// hasTxn tells whether ops holds a transaction.
func hasTxn(ops []clientv3.Op) bool {
	for _, op := range ops {
		if op.IsTxn() {
			return true
		}
	}
	return false
}
