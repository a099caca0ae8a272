package delayrec

import (
	"math/rand/v2"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func kv(value string, lease int64) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: []byte("r"), Value: []byte(value), Lease: lease, ModRevision: 7}
}

func TestParse(t *testing.T) {
	for _, c := range []struct {
		value string
		want  Record
	}{
		{"held 12 20s", Record{State: Held, Token: 12, Delay: 20 * time.Second}},
		{"lost 12 1m0s", Record{State: Lost, Token: 12, Delay: time.Minute}},
		{"released 12", Record{State: Released, Token: 12, Delay: Unknown}},
		// An older version's records say no delay.
		{"held 12", Record{State: Held, Token: 12, Delay: Unknown}},
		{"lost 12", Record{State: Lost, Token: 12, Delay: Unknown}},
		// Anything else is no record.
		{"", Record{}},
		{"held", Record{}},
		{"held x 1s", Record{}},
		{"held 0 1s", Record{}},
		{"held 12 soon", Record{}},
		{"held 12 -1s", Record{}},
		{"taken 12 1s", Record{}},
		{"held 12 1s extra", Record{}},
	} {
		got := Parse(kv(c.value, 0))
		c.want.ModRev = 7
		if got != c.want {
			t.Errorf("Parse(%q) = %+v, want %+v", c.value, got, c.want)
		}
	}
	if got := Parse(nil); got != (Record{}) {
		t.Errorf("Parse(nil) = %+v, want none", got)
	}
	for _, s := range []State{Held, Lost, Released} {
		v := Format(s, 42, 1500*time.Millisecond)
		r := Parse(kv(v, 0))
		if r.State != s || r.Token != 42 || (s != Released && r.Delay != 1500*time.Millisecond) {
			t.Errorf("Parse(Format(%v)) = %+v from %q", s, r, v)
		}
	}
}

func TestNext(t *testing.T) {
	sec := time.Second
	held := func(token int64, d time.Duration, lease int64) Record {
		return Record{State: Held, Token: token, Delay: d, Lease: clientv3.LeaseID(lease)}
	}
	for _, c := range []struct {
		name   string
		rec    Record
		own    time.Duration
		reader bool
		want   Step
	}{
		{"no record", Record{}, 5 * sec, false, Step{Action: RecordHeld}},
		{"no record, reader", Record{}, 5 * sec, true, Step{Action: Proceed}},
		{"released", Record{State: Released, Token: 5}, 5 * sec, false, Step{Action: RecordHeld}},
		{"own record", held(10, 5*sec, 3), 5 * sec, false, Step{Action: RecordHeld}},
		{"held by an older version", held(5, Unknown, 0), 5 * sec, false, Step{Action: RecordLoss, Delay: 5 * sec}},
		{"held, holder asked more", held(5, 20*sec, 0), 5 * sec, false, Step{Action: RecordLoss, Delay: 20 * sec}},
		{"held, own is more", held(5, 2*sec, 3), 5 * sec, false, Step{Action: RecordLoss, Delay: 5 * sec}},
		{"held on a lease", held(5, 20*sec, 3), 5 * sec, false, Step{Action: RecordLoss, Delay: 20 * sec}},
		{"held on a lease, reader", held(5, 20*sec, 3), 5 * sec, true, Step{Action: RecordLoss, Delay: 20 * sec}},
		{"lost", Record{State: Lost, Token: 5, Delay: 20 * sec}, 5 * sec, false, Step{Action: Await}},
		{"lost by an older version", Record{State: Lost, Token: 5, Delay: Unknown}, 30 * sec, false, Step{Action: RecordLoss, Delay: 30 * sec}},
		{"lost, own is more", Record{State: Lost, Token: 5, Delay: 2 * sec}, 5 * sec, true, Step{Action: RecordLoss, Delay: 5 * sec}},
	} {
		if got := Next(c.rec, 10, c.own, c.reader); got != c.want {
			t.Errorf("%s: Next = %+v, want %+v", c.name, got, c.want)
		}
	}
}

// lossWorld is one loss of a holding and the record it leaves, on a
// timeline: how etcd's leases and the holder's own rewrite change the
// record, for TestNextWaitsOutEveryLoss to run a waiter through.
type lossWorld struct {
	rec     Record
	lapse   time.Duration // when the record's lease ends; -1 for never
	rewrite time.Duration // when the holder records its own loss; -1 for never
	heldFor time.Duration // the holder's delay, for its rewrite
	lapseAt time.Duration // when the held record's lease ends by itself
}

// ceilSec is a lease's TTL as etcd grants it for d: whole seconds.
func ceilSec(d time.Duration) time.Duration {
	return (d + time.Second - 1) / time.Second * time.Second
}

// at brings the record to time now.
func (w *lossWorld) at(now time.Duration) {
	if w.rewrite >= 0 && now >= w.rewrite {
		if w.rec.State == Held {
			w.rec = Record{State: Lost, Token: w.rec.Token, Delay: w.heldFor, Lease: 9}
			w.lapse = w.rewrite + ceilSec(w.heldFor)
		}
		w.rewrite = -1
	}
	if w.lapse >= 0 && now >= w.lapse {
		w.rec, w.lapse = Record{}, -1
	}
}

// next is when the record next changes by itself after now; -1 for never.
func (w *lossWorld) next(now time.Duration) time.Duration {
	n := time.Duration(-1)
	for _, t := range []time.Duration{w.rewrite, w.lapse} {
		if t > now && (n < 0 || t < n) {
			n = t
		}
	}
	return n
}

// Random losses of a holding, of every kind, found by a waiter at a
// random time after: the waiter starts no earlier than the loss plus the
// delay the holder asked, and no earlier than the loss plus the longer of
// that and its own if it found the loss still recorded; no later than
// that delay after it found the loss (plus etcd's rounding to whole
// seconds); and a record whose holder's session ended that long ago
// delays nothing.
func TestNextWaitsOutEveryLoss(t *testing.T) {
	const token = 100
	rng := rand.New(rand.NewPCG(4, 9))
	for i := range 20000 {
		ttl := time.Duration(2+rng.IntN(9)) * time.Second
		heldFor := time.Duration(rng.IntN(31)) * time.Second
		own := time.Duration(rng.IntN(31)) * time.Second
		old := rng.IntN(5) == 0 // written by an older version: no delay, no lease
		w := &lossWorld{rewrite: -1, lapse: -1, heldFor: heldFor}
		w.rec = Record{State: Held, Token: token - 1, Delay: heldFor, Lease: 3, ModRev: 1}
		lossAt := time.Duration(rng.IntN(10000)) * time.Millisecond
		kind := rng.IntN(3)
		switch {
		case old:
			w.rec.Delay, w.rec.Lease = Unknown, 0
		case kind == 0: // the session expired: its last keep-alive was a TTL before
			w.lapse = lossAt - ttl + ceilSec(ttl+heldFor)
		case kind == 1: // the lease was revoked, up to a third of a TTL after a keep-alive
			w.lapse = lossAt - time.Duration(rng.Int64N(int64(ttl/3))) + ceilSec(ttl+heldFor)
		default: // the key was deleted; the session lives and its holder notices
			w.rewrite = lossAt + time.Duration(rng.IntN(2000))*time.Millisecond
		}
		// A leader change may end the record's lease early against the
		// session's (crowded expiries are spread out): up to all of the
		// gap, a quarter of the time.
		squeezed := kind < 2 && !old && heldFor > 0 && rng.IntN(4) == 0
		if squeezed {
			w.lapse -= time.Duration(rng.Int64N(int64(heldFor)))
		}
		need := own
		if !old {
			need = max(own, heldFor)
		}
		found := lossAt + time.Duration(rng.IntN(60000))*time.Millisecond
		w.lapseAt = w.lapse
		now, steps := found, 0
		w.at(found)
		present := w.rec.State != Clear
		var st Step
		for ; steps < 10; steps++ {
			w.at(now)
			rec := w.rec
			st = Next(rec, token, own, false)
			if st.Action == RecordLoss {
				w.rec = Record{State: Lost, Token: rec.Token, Delay: st.Delay, Lease: 8}
				w.lapse = now + ceilSec(st.Delay)
				continue
			}
			if st.Action != Await {
				break
			}
			n := w.next(now)
			if n < 0 {
				t.Fatalf("case %d: awaits a record that never changes: %+v", i, w.rec)
			}
			now = n
		}
		if st.Action != RecordHeld {
			t.Fatalf("case %d: never done after %d steps: %+v", i, steps, st)
		}
		// The holder's own delay always holds; the longer one whenever the
		// waiter found the loss still recorded.
		// A squeezed record that lapsed before the waiter came is the
		// documented gap: only a record still there is counted on.
		if floor := lossAt + map[bool]time.Duration{true: need, false: heldFor}[present]; !old && !squeezed && now < floor || now < lossAt+need && present {
			t.Fatalf("case %d (kind %d, old %v): started %v after the loss, want at least %v (found %v after, own %v, held %v, ttl %v, present %v)",
				i, kind, old, now-lossAt, floor-lossAt, found-lossAt, own, heldFor, ttl, present)
		}
		if now > found+ceilSec(need) {
			t.Fatalf("case %d (kind %d, old %v): started %v after finding the loss, want at most %v", i, kind, old, now-found, ceilSec(need))
		}
		if !old && kind < 2 && found >= w.lapseAt && now != found {
			t.Fatalf("case %d: a session ended %v before waited %v", i, found-lossAt, now-found)
		}
	}
}
