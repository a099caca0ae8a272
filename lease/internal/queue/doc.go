// Package queue holds the decisions a lock makes about its place in the
// queue of a name, as pure code: no I/O, no goroutine, no clock. Package
// lease carries them out against etcd and feeds back what it learns.
//
// Rule is the one rule that grants a lock (its invariant is stated on the
// type): the facts it is fed are snapshots of the queue, reads of the own
// key and keys ahead, and the events of the subscriptions the lock listens
// to; it answers with a Decision. Nothing outside this package decides a
// grant. The explorer in this package's tests drives it through random
// orders of those facts against a history of the queue, and the build tag
// leasefence_mutants plants bugs in it that the explorer must catch.
package queue
