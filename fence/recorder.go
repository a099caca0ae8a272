package fence

import (
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Recorder is a fence record that a process writes through again and
// again: it remembers the token last recorded through it, so that a
// holder's writes after its first are sent as one flat transaction (the
// record equals the token, then the caller's part) that costs no more
// than a Held guard's. Its guards are Resource guards with that one
// difference: the first write with a new token, and any write after the
// record was found changed, use the full shape, so every write is still
// one round trip and still refused if the record is above the token.
//
// A Recorder is safe for concurrent use. Keep one per record key for the
// life of the process; what it remembers is only a guess about which shape
// to send, never trusted for safety (etcd compares the record in every
// transaction).
type Recorder struct {
	key string

	mu       sync.Mutex
	recorded int64 // the highest token known to be in the record
}

// NewRecorder returns a Recorder for the fence record at key. An empty key
// is refused at Commit, as for Resource.
func NewRecorder(key string) *Recorder { return &Recorder{key: key} }

// Key is the record's key.
func (r *Recorder) Key() string { return r.key }

// Guard is Resource(r.Key(), token), sent in its steady shape when the
// record is known to hold token already.
func (r *Recorder) Guard(token int64) Guard {
	return Guard{kind: resourceGuard, key: r.key, token: token, rec: r}
}

// knows tells whether the record is known to hold token.
func (r *Recorder) knows(token int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.recorded == token
}

// note records that the record now holds token (or a higher one).
func (r *Recorder) note(token int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recorded = max(r.recorded, token)
}

// forget drops what the Recorder knows, after the record was found to
// differ from it.
func (r *Recorder) forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recorded = 0
}

// steady tells whether every Resource guard of the transaction is known to
// be recorded already, so that the steady shape can be tried.
func (t *Txn) steady() bool {
	recs := t.resources()
	for _, g := range recs {
		if g.rec == nil || !g.rec.knows(g.token) {
			return false
		}
	}
	return len(recs) > 0
}

// buildSteady lays out the steady shape: one level comparing the Held
// guards and every record with its token, the caller's part in Then, and
// reads of the lock keys and records in Else, to say what failed.
func (t *Txn) buildSteady() (cmps []clientv3.Cmp, then, els []clientv3.Op) {
	cmps, els = t.heldChecks()
	for _, g := range t.resources() {
		cmps = append(cmps, clientv3.Compare(clientv3.Value(g.key), "=", EncodeToken(g.token)))
		els = append(els, clientv3.OpGet(g.key))
	}
	return cmps, t.caller(), els
}

// commitSteady sends the steady shape. done is false if it does not fit
// etcd's limits (nothing was sent), or a record was found below its token
// or missing (what the Recorder knew was wrong, nothing was written): the
// full shape must be sent instead, and is checked against the limits then.
func (t *Txn) commitSteady() (resp *clientv3.TxnResponse, done bool, err error) {
	cmps, then, els := t.buildSteady()
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
	if r.Succeeded {
		return t.callerPart(r.Header, r.Responses), true, nil
	}
	if err := t.heldFailures(r); err != nil {
		return nil, true, err
	}
	recs := t.resources()
	held := len(els) - len(recs) // the records' reads follow the lock keys'
	for i, g := range recs {
		kvs := r.Responses[held+i].GetResponseRange().Kvs
		if len(kvs) == 0 {
			g.rec.forget()
			continue
		}
		highest, err := DecodeToken(string(kvs[0].Value))
		switch {
		case err == nil && highest > g.token:
			return nil, true, &StaleError{Key: g.key, Token: g.token, Highest: highest}
		case err != nil || highest < g.token:
			g.rec.forget() // the full shape decides
		}
	}
	return nil, false, nil
}
