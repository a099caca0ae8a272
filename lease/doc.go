// Package lease takes named locks on etcd and gives each holder a fencing
// token.
//
// A Session is one etcd lease, kept alive in the background. Session.Lock
// queues for a name the way etcd's own concurrency.Mutex does (the key is
// name + "/" + the lease ID in hex, and the holder is the oldest key under
// the name), so locks taken here exclude, and are excluded by,
// concurrency.Mutex, etcd's Lock RPC and etcdctl lock.
//
// Session.Campaign is leader election on the same queue: the leader is the
// holder of the election name, and its key carries a value (an address, say)
// that Proclaim changes. CurrentLeader and Observe read the leader with its
// value and its token, so a follower can pass the leader's token on and a
// resource can fence the leader's writes. The layout is etcd's own, shared
// with concurrency.Election, etcd's Election RPC and etcdctl elect. A
// Leadership ends, and shows it, exactly as a Lock does.
//
// Session.RLock and TryRLock take a name for reading: readers share it,
// writers (Lock, TryLock, Campaign, and etcd's own Mutex, which knows
// nothing of readers) exclude everyone, and the queue is first in, first
// out, so a reader that queues behind a waiting writer waits for it and
// writers never starve. Every holding, read or write, has a token.
//
// WithLockDelay is for resources that cannot check a token at all: after
// a holder lost its lock involuntarily (its lease expired or was revoked,
// or its key was deleted by someone else), the next holder waits a delay
// before it is told it holds the lock, so that requests the lost holder
// already sent can drain. A clean release (Unlock, Resign, Close) causes
// no delay.
//
// # Which to use
//
//   - Lock, with a fence (package fence) at the resource: one writer at a
//     time, and a write from an earlier holder is refused by the resource
//     itself. The default for anything two writers would corrupt.
//   - RLock beside Lock: many readers or one writer. A reader's token
//     works like Chubby's sequencer with its mode: every writer with a
//     smaller token had released before the reader was granted, and none
//     with a larger one can be granted until the reader lets go. Reads of
//     data in etcd fenced by fence.Held(readHolding) therefore see no
//     writer's half-done work and never come from a reader whose holding
//     ended. A resource elsewhere that records the highest writer token it
//     accepted refuses a read token below that record: it comes from a
//     read holding a later writer has replaced, exactly as a stale writer
//     is refused. Fenced with writers' tokens, a resource refuses anything
//     from every earlier holding: a writer's token is above those of all
//     the readers it followed.
//   - WithLockDelay on top, when the resource cannot check a token: it
//     narrows the window in which a lost holder's requests land after the
//     next holder began; it does not close it (a holder paused longer than
//     the delay still writes late). Consul's and Chubby's lock-delay are
//     the model.
//   - No counting semaphore is offered: holders of N permits are not
//     ordered among themselves, so one token cannot fence them; N exclusive
//     slots are N locks ("jobs/slot-0" ... "jobs/slot-N-1"), each with its
//     own token.
//
// Run and Lead hold a lock or a leadership under supervision: they create
// the session, call the caller's function while held, release on return,
// and take the holding again after a loss, so that the function resumes
// from its fenced state. Package leasetest runs a real etcd, with faults,
// for the tests of code built on this package.
//
// For operators: Inspect reads a lock's queue (holder, waiters, tokens,
// leases, TTLs), Health is a readiness check, Hooks feed metrics (package
// fence/fenceprom), and every state change of a lock is logged once
// through the session's logger. A session that sees etcd's store revision
// go backwards (a snapshot restore without --bump-revision) ends its locks
// with ErrRevisionRegressed.
//
// # What is guaranteed
//
//   - Lock.Token is the creation revision of the lock key: raft-committed,
//     cluster-wide, and strictly larger for every later holder of the same
//     name, across etcd leader changes. It is never the response header
//     revision (which differs when the lock was contended) nor the lease ID
//     (which is not ordered).
//
//   - A waiter is told it holds the lock only when no key older than its
//     own is left in its view of the queue: a read kept current since by
//     deletion watches that were up the whole time (otherwise it reads
//     again), with its own key found with its token by that read or by one
//     made once the watch of its own key was up. A lock granted by the
//     read that came back with its own key's put needs no watch for that.
//     A waiter whose key or session vanishes returns at once with an
//     error, never the lock, even when its key goes in the same
//     transaction as the last key ahead: a waiter is granted only once its
//     own key is known to have lasted until the last deletion ahead, from
//     a read at that revision or later or from the queue watch, which
//     delivers both in order.
//
//   - Unlock deletes the key only if its creation revision is still the
//     token, so it never removes a successor's key. A failed or cancelled
//     Lock removes its own key before it returns.
//
//   - Locks of one name taken through one session exclude each other, and
//     names nest: "jobs" and "jobs/7" are independent locks.
//
//   - Only lock keys are places in a lock's queue: a key one level under
//     name + "/" whose last segment is the lowercase hex ID of the lease it
//     is attached to, the layout etcd's own lock and election write. Other
//     keys under the name (a checkpoint, a fence record, a key with no
//     lease) are ignored by Lock, TryLock, Campaign, CurrentLeader and
//     Observe, so data may live beside its lock. etcd's own
//     concurrency.Mutex, Election and etcdctl lock count every key under
//     the name and would wait on such a key forever: when those share a
//     name with this package, keep data under another prefix. Most queue
//     reads are not keys-only (etcd 3.7 leaves the lease out of keys-only
//     reads), so keep data beside a lock small.
//
//   - Waiting is cheap per handoff, and holding costs no requests. Each
//     session keeps, per name it uses, one long-lived watch of its own key
//     (deletions, and puts by others) that tells holders and waiters their
//     key is gone or taken over. A
//     lock granted at once opens it only once held for 50 ms (then
//     reading the key again), so a lock held briefly is not sent its own
//     Unlock's deletion.
//     A waiter with three keys or fewer ahead (for a reader, counting the
//     readers' keys ahead, which do not block it) also follows a
//     long-lived watch of the deletions under the name: the last deletion
//     ahead grants it the lock with no read, so a handoff costs the
//     holder's delete and one event. A waiter further back follows only
//     the two newest keys ahead of it (for a reader, the newest writers'),
//     through watches of single keys that the session keeps across its
//     locks of the name: lock keys are named by session, so in a queue of
//     steady contenders a waiter queues behind the same two sessions round
//     after round and opens no watch. When the older of the two goes, the
//     newer one usually holds the lock; the waiter then asks, keys-only,
//     which keys under the name are older than its own (a serializable
//     read at a known revision; etcd 3.7 answers it from its index), and
//     when the newer one goes it is granted with no read. A long queue
//     thus does not send every deletion to every waiter, and the read
//     stays off the path of the handoff. A writer whose last lock of the
//     name queued behind more than a page (16 keys) also queues with a
//     keys-only read, counting every key under the name as a writer ahead
//     until it reads the keys it follows (or the whole view, near the
//     head) in full: a full read makes etcd fetch every key under
//     the name to sort them, a keys-only one on 3.7 does not. Sessions renewed
//     through one Keeper share each name's queue watch (one message per
//     put or deletion reaches the process), which keeps a copy of the
//     queue in order: their locks wait on it, so an enqueue is a put
//     alone, a deletion wakes only the waiters it grants, and waiters are
//     granted with no read at any depth (up to 4,096 keys under the name;
//     past that, and while the watch is down, they read as above). Watches are opened at
//     the current revision, which etcd serves at once, and outlive the
//     last lock of their name by 1 second, so that a lock taken again and
//     again opens them once; they rest after eight locks in a row that did
//     not need them (granted at once, and, for the own-key watch, held
//     briefly), and open again for the next lock that waits.
//
//   - Bad input (an empty name, a name ending in "/", with an empty
//     segment or a control character; a nil client or option) is refused
//     with an error wrapping ErrInvalidArgument before anything is sent.
//     Every error matches one of the package's sentinels or the error of
//     the context or etcd request that ended the call, and names the
//     package once.
//
//   - Release builds contain no test hook: the fault suite's deliberate
//     bugs and scaled clock exist only under the build tag
//     leasefence_mutants.
//
//   - An Observer delivers leaders in the order etcd committed them (by
//     token, then by value revision) and, after a reconnect, a compaction or
//     a broken watch, reads the leader afresh: it may skip a leader that came
//     and went meanwhile, never the current one.
//
//   - Readers are told they hold the name only when no writer's key is
//     older than their own; a writer only when no key at all is. A read
//     holding ends, and shows it, exactly as a write holding does.
//
//   - With WithLockDelay, a holding that follows an involuntary loss
//     recorded by its name's previous holder is granted no sooner than the
//     delay after the new holder learned of the loss, measured by an etcd
//     lease (see WithLockDelay for what it rests on).
//
// # What is not
//
// A lease-based lock is not exclusive in time. A holder can pause (garbage
// collection, swapping, SIGSTOP, a slow disk) past its lease; etcd then gives
// the lock to the next waiter, and the paused holder wakes up believing it
// still holds it. Lock.Done, Lock.Err, Lock.Context and Session.Done are
// early warnings, computed conservatively (from when each keep-alive was
// sent, not when its answer came), but a paused process sees none of them
// until it runs again. Only a check made by the protected resource, in the
// same atomic step as the write, makes the write safe: pass Lock.Token to it
// (see package fence).
//
// A lock learns that its key is gone from the key's deletion (expiry or
// revocation of the lease, Close, someone deleting it, lockctl release).
// A lock granted at once, with nobody ahead, learns of a deletion in its
// first 50 ms only at their end, when it opens the watch of its key (the
// lease's expiry it learns from the session as ever).
// A put by someone else that moves the key off the session's lease (an
// etcdctl put on the lock key) ends the holding with ErrKeyDeleted, and
// fence.Held refuses the key from then on; one that keeps the lease (a put
// made with the session's own lease ID) is not told apart from the
// holder's own.
//
// Tokens compare only within one lock name. Restoring etcd from a snapshot
// can move revisions, and so tokens, backwards unless the restore bumps
// them (etcdutl snapshot restore --bump-revision N --mark-compacted).
package lease
