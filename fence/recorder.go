package fence

import "sync"

// Recorder is a fence record that a process writes through again and
// again. Its guards are Resource guards, with the same guarantees, made
// cheaper for a holder's writes after its first: those do not write the
// record again, which already holds their token, and cost etcd about what
// a Held guard's writes do.
//
// A Recorder is safe for concurrent use. Keep one per record key for the
// life of the process. What it remembers of the record is never trusted
// for safety: etcd checks the record in every transaction, so a write is
// still refused if anyone raised the record above its token.
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

// Guard is Resource(r.Key(), token), made cheaper once a write through the
// Recorder has recorded token.
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

// forget drops what g's Recorder knows of its record, if g has one.
func (g Guard) forget() {
	if g.rec != nil {
		g.rec.forget()
	}
}
