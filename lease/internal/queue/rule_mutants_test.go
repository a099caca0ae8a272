//go:build leasefence_mutants

package queue

import (
	"strings"
	"testing"
)

// Each deliberate bug in the grant rule, a waiter or a Keeper's copy must
// make the explorer fail. A waiter that ends its subscription to the queue watch's
// events as it joins the copy, without telling its rule, is bug 1 of
// issue 35 with its fix reverted, where the bug was: in the Keeper's
// world the explorer must find it as the hang it was, a waiter behind a
// free lock trusting a watch it no longer hears.
func TestGrantRuleExplorerCatchesMutants(t *testing.T) {
	const seeds = 20000
	grant := func(m grantMutation) func(*world) { return func(w *world) { w.q.Rule.seam.mutation = m } }
	waiter := func(m waiterMutation) func(*world) { return func(w *world) { w.q.seam.mutation = m } }
	copyOf := func(m copyMutation) func(*world) {
		return func(w *world) {
			if w.queue != nil && w.queue.copy != nil {
				w.queue.copy.seam.mutation = m
			}
		}
	}
	for _, m := range []struct {
		name   string
		mutate func(*world)
		shape  worldShape
		want   string // what the failure must say; any failure if empty
	}{
		{"watch vouches before its start", grant(grantIgnoresStart), worldShape{}, ""},
		{"grant without the own key past the snapshot", grant(grantIgnoresOwn), worldShape{}, ""},
		{"joining the copy keeps trusting the watch's events", waiter(waiterJoinKeepsTrust), worldShape{}, ""},
		{"a Keeper's waiter trusts the watch it left for the copy", waiter(waiterJoinKeepsTrust), worldShape{keeper: true}, "hangs: the queue grants it"},
		{"the copy does not wake its new head", copyOf(copyMissesHead), worldShape{keeper: true}, "hangs: the queue grants it"},
		// The four below break JoinCopy's and LeaveCopy's word, which
		// package lease's order of steps makes harmless today (the lock
		// looks in the copy before it decides, and a watch's down follows
		// its epoch's moving on): the explorer catches them by holding the
		// waiter to what the watches know (joinCopy, checkTrust).
		{"joining the copy never refuses", waiter(waiterJoinNeverRefuses), worldShape{keeper: true}, "JoinCopy says joined true"},
		{"joining takes the copy of an epoch the watch left", waiter(waiterJoinIgnoresEpoch), worldShape{keeper: true}, "JoinCopy says joined true"},
		{"leaving the copy keeps the lock on it", waiter(waiterLeaveKeepsMirrored), worldShape{keeper: true}, "the waiter says it waits on the copy: true"},
		{"the copy's subscription is up in the first epoch", waiter(waiterJoinUpsFirstEpoch), worldShape{keeper: true}, "up in generation 1, while the watch is in"},
	} {
		t.Run(m.name, func(t *testing.T) {
			for seed := range uint64(seeds) {
				if w := run(seed, 60, m.mutate, m.shape); w.err != nil && strings.Contains(w.err.Error(), m.want) {
					t.Logf("caught: %.200s", w.err)
					return
				}
			}
			t.Fatalf("the explorer did not catch %q in %d runs", m.name, seeds)
		})
	}
}

// Each deliberate bug in how a waiter waits must make the step explorer
// fail: a hang once everything is delivered, or a grant the queue does
// not allow.
func TestWaiterStepExplorerCatchesMutants(t *testing.T) {
	const seeds = 20000
	for _, m := range []struct {
		name     string
		mutation waiterMutation
	}{
		{"a followed key's going goes unseen", waiterDropsRefollow},
		{"a far waiter stays far", waiterKeepsFar},
		{"the own key is not confirmed after its watch was down", waiterSkipsConfirmOwn},
	} {
		t.Run(m.name, func(t *testing.T) {
			for seed := range uint64(seeds) {
				if w := runSteps(seed, 60, func(q *Waiter) { q.seam.mutation = m.mutation }); w.err != nil {
					t.Logf("caught: %.300s", w.err)
					return
				}
			}
			t.Fatalf("the step explorer did not catch %q in %d runs", m.name, seeds)
		})
	}
}
