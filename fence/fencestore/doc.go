// Package fencestore holds what the transport fences (fencehttp, fencegrpc)
// share: the Store that records, per lock name, the highest fencing token a
// service has accepted, and the Claim a request carries, with the strict
// text form of its name and token.
//
// # What is guaranteed
//
// Store.Accept checks and records a token in one atomic step: a Store never
// accepts a token lower than one it accepted before, whatever the number of
// concurrent callers (and, for EtcdStore, of processes). MemoryStore.Do and
// a fence.Txn guarded by EtcdStore.Guard extend that step over a write of
// the caller's: the write happens only if the token is still not stale, and
// no lower token is accepted after it.
//
// # What is not
//
// An Accept followed by a separate write is two steps: a higher token can
// be accepted between them, and the lower write then lands after it. Writes
// that must be ordered by token go through MemoryStore.Do or an
// EtcdStore.Guard transaction. A MemoryStore forgets everything when its
// process ends; an EtcdStore is shared by every process using its prefix.
package fencestore
