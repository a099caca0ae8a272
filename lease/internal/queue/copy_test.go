package queue

import (
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// TestCopyTakesOnlyItsEpoch: a copy is of one epoch of its watch and takes
// nothing of another: not its events, nor a lock that queued in it, nor a
// reload. Each act is tried in the copy's epoch, where it must take
// effect, and in another, where it must not.
//
// The explorer (rule_explore_test.go) cannot tell these checks from none,
// as no world like package lease's hands a copy anything of another
// epoch that matters: a watch's events, downs and ups come on one
// goroutine, each down drops the copy (Drop) before the next up reads it
// again, and a copy read after an up is at or past every event of the
// stretches before, which Apply skips by revision anyway. A lock of
// another epoch is refused by JoinCopy, and looks in the copy of its own.
func TestCopyTakesOnlyItsEpoch(t *testing.T) {
	const epoch, other, token = Epoch(3), Epoch(5), 4
	kv := func(key string, rev int64) *mvccpb.KeyValue {
		return &mvccpb.KeyValue{Key: []byte(key), CreateRevision: rev, ModRevision: rev, Lease: otherLease}
	}
	// The lock's key q/own (made at token) behind q/a, read at 10.
	fresh := func() *Copy {
		c := NewCopy(CopyConfig{
			IsQueueKey: func(kv *mvccpb.KeyValue) bool { return kv.Lease != 0 },
			IsWriter:   func(kv *mvccpb.KeyValue) bool { return string(kv.Value) != readerVal },
			Limit:      4, Resume: 2, Slack: 1,
		})
		c.Install([]*mvccpb.KeyValue{kv("q/a", 2), kv("q/own", token)}, false, 2, 10, epoch)
		return c
	}
	// Off: too many keys (9), counted from the read at 10.
	off := func(c *Copy) { c.Install(nil, true, 9, 10, epoch) }
	delA := Events{N: 1, At: func(int) *mvccpb.Event {
		return &mvccpb.Event{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte("q/a"), ModRevision: 11}}
	}}
	for _, tc := range []struct {
		name string
		act  func(c *Copy, e Epoch) bool // whether the act took effect
	}{
		{"applies events", func(c *Copy, e Epoch) bool {
			c.Join(epoch, token, false)
			wake, _ := c.Apply(delA, e, nil)
			return c.State().Keys == 1 && len(wake.Heads) == 1
		}},
		{"counts events while off", func(c *Copy, e Epoch) bool {
			off(c)
			c.Apply(delA, e, nil)
			return c.State().Count == 8
		}},
		{"is current", func(c *Copy, e Epoch) bool { return c.Current(e) }},
		{"is read again once off", func(c *Copy, e Epoch) bool {
			off(c)
			_, ok := c.Reloadable(e)
			return ok
		}},
		{"joins a lock", func(c *Copy, e Epoch) bool {
			joined, wait := c.Join(e, token, false)
			return joined || wait
		}},
		{"shows a lock its view", func(c *Copy, e Epoch) bool { return c.Snapshot(e, "q/own", token, false).OK }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.act(fresh(), epoch) {
				t.Errorf("the copy of epoch %d does not take an act of its own epoch", epoch)
			}
			if tc.act(fresh(), other) {
				t.Errorf("the copy of epoch %d takes an act of epoch %d", epoch, other)
			}
		})
	}
}
