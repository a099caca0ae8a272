package lease

import "time"

// The package's tuning constants, in one place: each says what it sets,
// what it is coupled to, and where it was measured (or that it was set by
// reasoning). Change one with the others it names in mind.

// How a waiter reads and follows its queue.

// queuePage is how many keys one read of a queue returns.
//
// Coupled to nearAhead (a waiter is near only on a complete view, so
// nearAhead stays well under a page) and sharedPage.
const queuePage = 16

// sharedPage is queuePage for a lock on a Keeper's shared queue watch: it
// hears every deletion ahead at no cost per waiter, so it reads the whole
// queue ahead once. etcd reads the whole range to sort it either way.
//
// Coupled to queuePage, which it replaces on a Keeper's shared watch.
const sharedPage = 1024

// nearAhead is how many keys ahead a waiter may have and still follow
// every deletion through the queue watch; further back it follows only
// followKeys keys, lest every deletion reach every waiter. Readers' keys
// count for a reader too: their deletions pushed etcd's watchers into its
// 100 ms catch-up loop.
//
// Coupled to followKeys (what a far waiter follows instead) and queuePage.
const nearAhead = 3

// followKeys is how many keys ahead a far waiter follows: the two newest.
// When the older goes, the newer usually holds the lock and the waiter
// reads its view meanwhile, so no read lies between the holder's delete
// and the grant, as it would when following one key.
//
// Coupled to keptFollows (a session keeps as many follow watches as a waiter
// follows) and nearAhead.
const followKeys = 2

// keptFollows is how many watches of keys ahead a session keeps per name,
// closing the least recently used. Steady contenders queue behind the same
// two sessions each round; more watches send deletions nobody waits for
// (16 contenders: 4.5 events per handoff with four kept, 3 with two).
//
// Measured with bench's BenchmarkHandoff, which counts stream messages per
// handoff.
const keptFollows = followKeys

// How watches rest and outlive their locks.

// ownWatchDelay is how long a lock granted with its own-key watch down is
// held before the watch opens: a deletion by someone else is seen late by
// up to this much. The fence, not this report, keeps a late writer out.
//
// Coupled to restAfter (restOwn pauses the own-key watch only for locks held
// under this) and to the package doc, which promises this bound.
const ownWatchDelay = 50 * time.Millisecond

// restAfter is how many locks of a name in a row that did not need its
// queue watch, or its own-key watch, pause that watch (watch.Watch.Granted).
// Running, the queue watch sends every put and deletion under the name, and
// the own-key watch those of its key: all the stream traffic of an
// uncontended name. Eight keep a name contended now and then from closing and opening
// them for each lock.
//
// Coupled to idleWatch: both decide when a watch stops costing a stream.
const restAfter = 8

// idleWatch is how long a name's watches outlive its last lock on the
// session, so a lock taken again and again opens them once. Not longer: an
// idle session is still sent every event of the others' handoffs.
//
// Coupled to restAfter; the tests of the registry sleep around it.
const idleWatch = time.Second

// The Keeper's copy of a queue.

// mirrorLimit is the most keys a queue mirror keeps. Above it the mirror
// only counts keys, and its locks read their view.
//
// Coupled to mirrorResume (half of it) and sharedPage.
const mirrorLimit = 4096

// mirrorResume is how few keys bring the copy back: half the limit, so
// each full read again follows at least 2048 deletions.
const mirrorResume = mirrorLimit / 2

// compactSlack is how many dead entries an order list may hold beyond
// twice the live keys, so a short queue is not compacted at every deletion.
//
// Set by reasoning, not measured.
const compactSlack = 64

// Writes that may go unanswered.

// putTries is how many times enqueue puts its key again after finding its
// marker moved, a key its session's late put left, or a key at its path
// that is no lock: once is expected, twice is a race.
//
// Set by reasoning, not measured.
const putTries = 3

// withdrawRefusals bounds the withdrawal's answered refusals: each means
// the marker or the key moved between its read and its write, which only
// late copies of the session's own requests and other clients do, so a
// few suffice.
//
// Set by reasoning, not measured.
const withdrawRefusals = 8

// Sessions, Keepers and observers.

// The renewer's lagWindow, how long a timer's lateness counts, is with the
// renewer in lease/internal/renew.

// keeperBatch is how early a Keeper may renew a lease, so that renewals due
// close together share a wake-up. Renewing early is always safe.
//
// Coupled to the renewer, which sends each lease's keep-alive a third of
// its TTL after the last (lease/internal/renew): a Keeper's is early by at
// most this.
// Set by reasoning, not measured.
const keeperBatch = 100 * time.Millisecond

// observerResync is how long an Observer trusts a silent watch before it
// reads afresh: a stream a reconnect left stuck would hide the leader.
//
// Set by reasoning, not measured.
const observerResync = 2 * time.Second

// Lock delay.

// delayLeaseMargin lengthens a session's delay lease beyond its TTL plus
// the delay: the leader revokes expired leases in batches about every
// 500 ms, so the session's lease can end up to that much after its TTL
// while the delay lease ends on time, which would shorten the gap between
// a holding's loss and its record's lapse below the delay.
//
// Coupled to etcd's lease revoke loop (500 ms, ETCD-FACTS). Measured:
// TestLockDelayAfterExpiry saw the record lapse 1.9985 s after a 2 s
// delay's key expiry without it.
const delayLeaseMargin = time.Second

// recheckBatch is how many held locks' reads of their keys go in one
// transaction (keyread.Batcher): etcd refuses a transaction of more than
// --max-txn-ops operations, 128 by default.
const recheckBatch = 128

// recheckInFlight is how many batches of those reads may be in flight at
// once: a batch etcd does not answer (sent to a member cut off from the
// quorum) then holds up only its own reads, until its timeout (the TTL),
// not every later one (TestStuckRecheckHoldsUpNoOther: a deletion seen
// 9 s late with one at a time). Set by reasoning; 4 keeps a burst's
// reads in large batches.
const recheckInFlight = 4
