// Package queue holds the decisions a lock makes about its place in the
// queue of a name, as pure code: no I/O, no goroutine, no clock. Package
// lease carries them out against etcd and feeds back what it learns.
//
// Rule is the one rule that grants a lock (its invariant is stated on the
// type): the facts it is fed are snapshots of the queue, reads of the own
// key and keys ahead, and the events of the subscriptions the lock listens
// to; it answers with a Decision, and says when the own key is lost.
// Nothing outside this package decides a grant. Waiter holds a lock's
// rule with its subscriptions: the lock starts and ends one only through
// the waiter, which tells the rule in the same step, and moves between a
// watch's events and a Keeper's copy of the queue the same way.
//
// Waiter.Next turns the rule's decision and the state of the lock's
// watches into the lock's next step: held, lost, TryLock's refusal, wait,
// or which read to make; package lease carries the step out.
//
// Two explorers in this package's tests drive them through random orders
// of facts against histories of the queue: the rule's, subscribing and
// joining the copy through the real Waiter, and the steps', which carries
// out every step Next hands out and checks that each can be carried out,
// and that once everything is delivered the waiter is held or lost within
// a bounded number of steps. The build tag leasefence_mutants plants bugs
// in the rule and the waiter that the explorers must catch.
package queue
