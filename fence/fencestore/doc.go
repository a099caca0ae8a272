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
// An EtcdStore (unless built WithoutVerifier), and a transport fence given a
// Verifier, accept a token above the highest they have accepted for a name
// only once an EtcdVerifier has seen, in one linearizable read, a key of
// that lock name with that creation revision on the lease its name encodes,
// and no older key of the queue ahead of it: the lock's holder (or one of
// its readers) as etcd has it, by the rule package lease grants by. A number no holding of the name ever had
// neither passes nor raises anything; the refusal wraps a
// *fence.UnverifiedError, and a verifier that cannot reach etcd gives
// ErrVerifierUnavailable, never an acceptance. Tokens at or below the
// highest accepted are decided with no read, and a confirmed token is
// remembered, so a holding costs a fence one read.
//
// # What is not
//
// An Accept followed by a separate write is two steps: a higher token can
// be accepted between them, and the lower write then lands after it. Writes
// that must be ordered by token go through MemoryStore.Do or an
// EtcdStore.Guard transaction. Guard verifies nothing: call Verify before
// it (the transports do; they cannot see through a Store that wraps an
// EtcdStore, which must then be given to them unwrapped or with
// WithVerifier). A verifier confirms the holder as of its read: a token
// confirmed once is remembered, and passes until a higher one is accepted
// even after its holding ends, as any accepted token does. A refused token
// is not remembered: each costs a read of the name's keys. A MemoryStore forgets everything when its
// process ends; an EtcdStore is shared by every process using its prefix.
package fencestore
