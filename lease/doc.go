// Package lease takes named locks on etcd and gives each holder a fencing
// token.
//
// A Session is one etcd lease, kept alive in the background. Session.Lock
// queues for a name the way etcd's own concurrency.Mutex does, so locks
// taken here exclude, and are excluded by, concurrency.Mutex, etcd's Lock
// RPC and etcdctl lock. Session.RLock shares a name among readers;
// Session.Campaign is leader election on the same queue (interoperating
// with concurrency.Election and etcdctl elect), with CurrentLeader and
// Observe to follow the leader. Run and Lead hold a lock or a leadership
// under supervision and take it again after a loss. A Keeper renews many
// sessions of one client together, and a Pool takes many locks through
// sessions of a Keeper, at most a set number on each lease. Inspect reads
// a lock's queue, Health is a readiness check, and Hooks feed metrics
// (package fence/fenceprom). Package leasetest runs a real etcd for tests.
//
// # Which to use
//
//   - Lock, with a fence (package fence) at the resource: one writer at a
//     time, and a write from an earlier holder is refused by the resource
//     itself. The default for anything two writers would corrupt.
//   - RLock beside Lock: many readers or one writer. Every writer with a
//     smaller token than a reader's released before the reader was
//     granted, and none with a larger one is granted until the reader lets
//     go, so a resource that records the highest writer token it accepted
//     can refuse a read from a replaced read holding, as it refuses a
//     stale writer.
//   - WithLockDelay on top, when the resource cannot check a token: after
//     an involuntary loss the next holder waits the delay, so that the
//     lost holder's requests in flight can land first. It narrows the
//     window; it does not close it.
//   - No counting semaphore: holders of N permits are not ordered among
//     themselves, so one token cannot fence them. N exclusive slots are N
//     locks, each with its own token.
//
// # What is guaranteed
//
//   - Lock.Token is the creation revision of the lock key: raft-committed,
//     cluster-wide, and strictly larger for every later holder of the same
//     name, across etcd leader changes.
//   - A lock is granted only if, at some revision between its call and its
//     return, its own key existed, attached to the session's lease, and no
//     older key that blocks it (any for a writer, a writer's for a reader)
//     was left under the name. A waiter whose key or session goes first
//     gets an error, never the lock.
//   - Unlock deletes the key only if it is still this holding's, so it
//     never removes a successor's key. A failed or cancelled Lock removes
//     its own key before it returns.
//   - Locks of one name taken through one session exclude each other.
//     Names nest as independent locks: "jobs" and "jobs/7".
//   - Only lock keys are places in a queue: one level under name + "/",
//     named by the lowercase hex ID of the lease they are attached to.
//     Other keys under a name (a checkpoint, a fence record) are ignored,
//     so data may live beside its lock. etcd's own Mutex, Election and
//     etcdctl lock wait on every key under the name: when they share a
//     name with this package, keep data under another prefix.
//   - A put by someone else that moves the lock key off the session's
//     lease ends the holding with ErrKeyDeleted, and fence.Held refuses
//     the key from then on. Such a key, left under the name, is no lock:
//     the waiters behind it are granted, Inspect and TryLock do not see
//     it, and the session's next lock of the name removes it.
//   - A waiter whose turn has come (no key that blocks it is left ahead,
//     and any lock-delay has passed) is granted, or its call returns,
//     within a few round trips once etcd answers; the fault suite checks
//     it against etcd's history.
//   - A write that had no answer and that etcd applies later, after the
//     caller gave up and even after the session's later writes, changes no
//     key of another holding (the session's next one, another session's,
//     another client's), and leaves no key that no lock owns past the
//     session's next lock of the name. A session is refused a name it
//     does not hold (ErrKeyInUse) only for a key on its own lease that
//     it did not put (keep other lock clients off Session.Lease), or one
//     whose creation etcd compacted away from its history before the
//     session found it.
//   - The package's own keys (see OwnPrefixes) lie where no name's queue,
//     ours or etcd's, can see them, for nested names too: etcd's Mutex,
//     Election and etcdctl lock on a parent name never wait behind them.
//   - Holding a lock sends nothing beyond the session's keep-alives, and a
//     handoff sends a few messages, not one per waiter in the queue.
//   - A held lock has no goroutine of its own: a session has three
//     however many locks it holds. What each costs in memory is measured
//     in bench/README.md (under 1 KB).
//   - A Pool takes at most the number of locks it was given through each
//     of its sessions at a time (held, or being taken), so no lease
//     carries the keys of more locks than that. With etcd's auth on, where
//     each put that attaches a lease costs a check of every key already on
//     it, taking n locks through a Pool takes time in proportion to n;
//     through one session, to n squared.
//   - An Observer delivers leaders in the order etcd committed them, and
//     after a reconnect, a compaction or a broken watch reads the leader
//     afresh: it may skip a leader that came and went, never the current
//     one.
//   - With WithLockDelay, a holding that follows an involuntary loss of a
//     session with a lock delay is granted no sooner than the longer of
//     its own delay and the lost holding's after the new holder learned of
//     the loss, measured by an etcd lease; a loss older than the lost
//     holding's delay (by etcd's count) delays nothing. Losses of sessions
//     without a lock delay are not waited out.
//   - Bad input (an empty name, one ending in "/", with an empty segment
//     or a control character; a nil client or option; ReaderValue as a
//     leader's value) is refused with an error wrapping ErrInvalidArgument
//     before anything is sent. Every
//     error matches one of the package's sentinels or the error of the
//     context or etcd request that ended the call.
//   - Release builds contain no test hook.
//
// # What is not
//
// A lease-based lock is not exclusive in time. A holder can pause (garbage
// collection, swapping, SIGSTOP, a slow disk) past its lease; etcd then
// gives the lock to the next waiter, and the paused holder wakes up
// believing it still holds it. Lock.Done, Lock.Err, Lock.Context and
// Session.Done are early warnings, computed conservatively: a cut-off
// session ends a twentieth of its TTL before etcd's earliest expiry, and
// earlier still by as late as its renewer's timer (its own, or its
// Keeper's) has lately fired (up to a quarter of the TTL). A process that stalls longer than that all
// at once hears late, and a paused one sees nothing until it runs again.
// Only a check made by the protected resource, in the same atomic step as
// the write, makes the write safe: pass Lock.Token to it (see package
// fence), and have a new holder claim the resource before it reads.
//
// A lock delay is timed by etcd's leases, which etcd may lengthen (a
// leader change) or, rarely, shorten: a holding that comes to a name only
// after the record of a loss has lapsed, where a leader change spread out
// thousands of expiring leases, can start up to a second or two early.
// A waiter queued at the loss counts from when it learned of it.
//
// A lock granted with nobody ahead learns of its key's deletion in its
// first 50 ms only at their end; after that, or once it had to wait, as
// soon as etcd's watch delivers the deletion (measured on one host: Done
// about 50 µs after the deleting client had its answer, with 10,000
// other locks held on the session; with 100,000 held, 100 of them
// deleted at once all ended within 3 ms of their deletes' answers). A put on the lock key made with the
// session's own lease ID is not told apart from the holder's own.
//
// The client must reach etcd itself, not etcd's gRPC proxy: the proxy
// answers watch requests out of the order the library checks for, so a
// lock that has to wait can wait for ever rather than be granted on
// news it cannot place.
//
// Tokens compare only within one lock name. Restoring etcd from a
// snapshot moves revisions, and so tokens, backwards unless the restore
// bumps them (etcdutl snapshot restore --bump-revision N
// --mark-compacted); a session that sees the store revision go backwards
// ends its locks with ErrRevisionRegressed.
//
// How waiting works, and why, is in docs/design.md.
package lease
