package lease

import (
	"context"
	"fmt"
)

// KeeperMirrorState is what the tests in mirror_test.go see of a Keeper's
// copy of one lock name's queue (test-only access to the unexported copy).
type KeeperMirrorState struct {
	Valid    bool   // the copy is complete
	Counting bool   // the copy is off: too many keys, being counted
	Count    int    // the keys counted, while Counting
	Keys     int    // the keys in the copy
	Queue    int    // entries in the copy's queue order list, dead ones included
	QueueCap int    // their capacity
	Writers  int    // entries in its writers' order list, dead ones included
	Rev      int64  // the newest revision applied
	Epoch    uint64 // the watch epoch the copy (or count) belongs to
	// WatchEpoch is the queue watch's own epoch: it grows whenever the
	// watch comes up or goes down.
	WatchEpoch uint64
}

// AwaitKeeperMirror waits until cond holds for k's copy of name's queue,
// looking again each time the copy moves, and returns the state it held
// in; it fails once ctx ends, or if k has no queue watch for name.
func AwaitKeeperMirror(ctx context.Context, k *Keeper, name string, cond func(KeeperMirrorState) bool) (KeeperMirrorState, error) {
	for {
		k.queues.mu.Lock()
		e := k.queues.m[name]
		k.queues.mu.Unlock()
		if e == nil || e.v.mirror == nil {
			return KeeperMirrorState{}, fmt.Errorf("no shared queue watch for %q", name)
		}
		m := e.v.mirror
		m.mu.Lock()
		c := m.c.State()
		st := KeeperMirrorState{Valid: c.Valid, Counting: c.Counting, Count: c.Count, Keys: c.Keys,
			Queue: c.Queue, QueueCap: c.QueueCap, Writers: c.Writers,
			Rev: c.Rev, Epoch: uint64(c.Epoch), WatchEpoch: uint64(e.v.w.Epoch())}
		moved := m.advanced
		m.mu.Unlock()
		if cond(st) {
			return st, nil
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return st, fmt.Errorf("copy of %q stayed at %+v: %w", name, st, ctx.Err())
		}
	}
}

// The copy's limits, for the tests: it goes off past KeeperMirrorLimit
// keys, and is read again once they are down to KeeperMirrorResume.
const (
	KeeperMirrorLimit  = mirrorLimit
	KeeperMirrorResume = mirrorResume
)
