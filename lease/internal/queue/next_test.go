package queue

import (
	"fmt"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// A waiter's next step, from the states a lock passes through, one case
// per branch of Next. The explorer drives the rule behind it through
// random orders of facts; these pin how the waiter turns the rule's
// decision and the watches' epochs into what the lock does.

const testLease = 7

// testFeed is a watch that is up in epoch 1, having handed on everything
// through seen.
type testFeed struct {
	keys      []string
	coversOwn bool
	seen      int64
	src       Source
}

func (f *testFeed) Range() ([]string, bool) { return f.keys, f.coversOwn }

func (f *testFeed) Subscribe(_ bool, listen func() Source) (Epoch, int64, Source) {
	f.src = listen()
	return 1, f.seen, f.src
}

func (f *testFeed) Unsubscribe() (Source, bool) { return f.src, f.src != 0 }

// testWaiter is the waiter of q/own, put at revision token on lease 7, with
// the given keys ahead (older, on live leases), read at token with the
// own-key and queue watches up in epoch 1.
func testWaiter(t *testing.T, token int64, ahead int, shared bool) (*Waiter, Now) {
	t.Helper()
	own := "q/own"
	owns := func(kv *mvccpb.KeyValue) bool {
		return kv != nil && kv.CreateRevision == token && kv.Lease == testLease
	}
	blocks := func(kv *mvccpb.KeyValue) bool { return kv.Lease != 0 && string(kv.Value) != "reader" }
	q := NewWaiter(NewRule(own, owns, blocks), Config{
		Shared: shared, Near: 3, Follow: 2,
		IsReader:   func(kv *mvccpb.KeyValue) bool { return string(kv.Value) == "reader" },
		IsQueueKey: func(kv *mvccpb.KeyValue) bool { return strings.HasPrefix(string(kv.Key), "q/") && kv.Lease != 0 },
		IsChild:    func(kv *mvccpb.KeyValue) bool { return strings.HasPrefix(string(kv.Key), "q/") },
	})
	q.SetToken(token)
	q.Subscribe(&testFeed{keys: []string{own}, coversOwn: true, seen: token - 1}, false)
	q.Subscribe(&testFeed{coversOwn: true, seen: token - 1}, false)
	var kvs []*mvccpb.KeyValue
	for i := ahead; i >= 1; i-- { // newest first, as the lock reads
		kvs = append(kvs, &mvccpb.KeyValue{Key: fmt.Appendf(nil, "q/k%d", i), CreateRevision: int64(i), ModRevision: int64(i), Lease: 1})
	}
	ownKV := &mvccpb.KeyValue{Key: []byte(own), CreateRevision: token, ModRevision: token, Lease: testLease}
	now := Now{Own: 1, Queue: 1, Follow: func(string) (Epoch, bool) { return 0, false }}
	q.Read(now.Own, now.Queue, nil, 0)
	q.Page(token, ownKV, kvs, false)
	return &q, now
}

func TestNextGrantedAtOnceOnlyOnTheFreshView(t *testing.T) {
	q, now := testWaiter(t, 10, 0, false)
	if st := q.Next(now, false, false); st.Kind != StepHeld || !q.AtOnce() || !q.Alone() {
		t.Fatalf("first look at an empty queue: %+v, at once %v, alone %v; want held at once, alone", st, q.AtOnce(), q.Alone())
	}
	q, now = testWaiter(t, 10, 1, false)
	q.Next(now, false, false) // fresh view, a key ahead: waits
	q.Rule.Events(0, 0, []*mvccpb.Event{{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte("q/k1"), ModRevision: 11}}}, 11)
	q.Rule.OwnRead(11, &mvccpb.KeyValue{Key: []byte("q/own"), CreateRevision: 10, ModRevision: 10, Lease: testLease})
	if st := q.Next(now, false, false); st.Kind != StepHeld || q.AtOnce() {
		t.Fatalf("granted on a later look: %+v, at once %v; want held, not at once", st, q.AtOnce())
	}
}

func TestNextNearWaiterWaitsOnTheQueueWatch(t *testing.T) {
	q, now := testWaiter(t, 10, 2, false)
	st := q.Next(now, false, false)
	if st.Kind != StepWait || st.PauseQueue || st.Pred == nil || string(st.Pred.Key) != "q/k2" {
		t.Fatalf("two ahead, watches up since the read: %+v; want wait behind q/k2, queue watch kept", st)
	}
	// The own-key watch went down and up since the read: a deletion of
	// the own key may have gone unseen, so the waiter confirms it first.
	now.Own = 3
	if st := q.Next(now, false, false); st.Kind != StepConfirmOwn {
		t.Fatalf("own-key watch restarted: %+v; want ConfirmOwn", st)
	}
}

func TestNextTryLockRefusedBehindAKey(t *testing.T) {
	q, now := testWaiter(t, 10, 1, false)
	if st := q.Next(now, true, false); st.Kind != StepLocked || string(st.Pred.Key) != "q/k1" {
		t.Fatalf("TryLock behind q/k1: %+v; want Locked naming it", st)
	}
}

func TestNextFarWaiterFollowsThenRereads(t *testing.T) {
	q, now := testWaiter(t, 10, 5, false)
	st := q.Next(now, false, false)
	if st.Kind != StepFollow || !st.PauseQueue {
		t.Fatalf("five ahead: %+v; want Follow with the queue watch paused", st)
	}
	keys := q.FollowKeys()
	if len(keys) != 2 || keys[0] != "q/k5" || keys[1] != "q/k4" {
		t.Fatalf("follow keys %v; want the two newest ahead", keys)
	}
	q.Subscribe(&testFeed{keys: keys, seen: 11}, false)
	epochs := map[string]Epoch{"q/k5": 1, "q/k4": 1}
	q.Followed(12, keys, []*mvccpb.KeyValue{
		{Key: []byte("q/k5"), CreateRevision: 5, ModRevision: 5, Lease: 1},
		{Key: []byte("q/k4"), CreateRevision: 4, ModRevision: 4, Lease: 1},
	}, epochs)
	now.Follow = func(k string) (Epoch, bool) { e, ok := epochs[k]; return e, ok }
	if st := q.Next(now, false, false); st.Kind != StepWait || !st.PauseQueue {
		t.Fatalf("both followed keys watched: %+v; want Wait, still far", st)
	}
	q.Rule.Events(0, 0, []*mvccpb.Event{{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte("q/k4"), ModRevision: 13}}}, 13)
	if st := q.Next(now, false, false); st.Kind != StepRereadFar {
		t.Fatalf("a followed key went: %+v; want RereadFar", st)
	}
	q.FarDone()
	if q.far {
		t.Fatal("FarDone left the waiter far")
	}
}

func TestNextSharedWatchNeverFar(t *testing.T) {
	q, now := testWaiter(t, 10, 5, true)
	if st := q.Next(now, false, false); st.Kind != StepWait || st.PauseQueue {
		t.Fatalf("five ahead on a Keeper's shared watch: %+v; want Wait, near", st)
	}
}

func TestNextLostKeyEndsTheWaiter(t *testing.T) {
	q, now := testWaiter(t, 10, 1, false)
	q.Rule.OwnRead(11, nil)
	if st := q.Next(now, false, false); st.Kind != StepLost {
		t.Fatalf("own key read gone: %+v; want Lost", st)
	}
}
