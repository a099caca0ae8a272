// Package fencegrpc carries fencing tokens across gRPC: client interceptors
// attach a lock's name and token to each call, and server interceptors refuse
// calls whose token is lower than one the service has already accepted for
// that lock. It is package fencehttp for gRPC, over the same Store (package
// fencestore).
//
// # Wire format
//
// Two metadata keys, each exactly once: leasefence-lock, the lock name
// (printable ASCII, as gRPC metadata requires), and leasefence-token, the
// token in canonical decimal (1 to 9223372036854775807, no sign, no leading
// zeros, no spaces). Anything else (a missing key, a repeated one, "007",
// "-1", "0", " 5", a number that overflows int64) fails with InvalidArgument
// and a message saying what is wrong; a checked call is never let through on
// metadata the server could not read, and the claim key is read strictly on
// every call, checked or not. The keys are text: their "-bin" forms are
// refused.
//
// A stale token fails with Aborted, the code gRPC documents for failed
// sequencer checks: the client must not retry the call as it is, but start
// again from a new lock holding. The status carries an errdetails.ErrorInfo
// with Domain "leasefence", Reason "STALE_FENCING_TOKEN" and the lock, the
// token offered and the highest accepted in its Metadata. The client
// interceptors turn it into a *fence.StaleError (errors.As), and StaleFrom
// does for clients without them; its Key is the lock name. A Store that cannot
// answer the check gives Unavailable: the handler has not run. A holder that
// already knows it has lost its lock sends nothing and gets FailedPrecondition
// wrapping fence.ErrNotHeld instead, so a client that handles a lost holding
// checks for both errors.
//
// A token the verifier did not confirm as the live holder's of the lock
// (WithVerifier, or an EtcdStore, which verifies by default) fails with
// PermissionDenied and an ErrorInfo with Reason "UNVERIFIED_FENCING_TOKEN",
// the lock, the token and etcd's revision when it was asked; the client
// interceptors turn it into a *fence.UnverifiedError (errors.Is
// fence.ErrUnverified), as UnverifiedFrom does. A verifier that could not
// ask etcd gives Unavailable.
//
// A third key, leasefence-claim, makes a call a claim (WithClaim). Its only
// value is "1", given once, with the two fencing keys; any other value, a
// repeated key, a claim without the fencing keys, or a claim on a call the
// server does not fence fails with InvalidArgument. A claim is always checked
// and its token recorded before the handler runs, whatever the method
// (unchecked methods included) and even with WithCheckInHandler: a read with a
// claim is "claim, then read" in one round trip.
//
// # What is guaranteed
//
// The interceptors check and record the token in one atomic step of their
// Store: a Store never accepts a token lower than one it accepted before. The
// lock name a call must carry is decided by the server (WithLockName or
// WithLockNameFunc), never by the client, since a client choosing a fresh name
// would pass any fence. Which methods are fenced is the Checker's choice too
// (WithUncheckedMethods, or a WithLockNameFunc that returns ""): wrapping its
// interceptors in an outside selector that skips methods would also let a
// claim on a skipped method through unrecorded, which the Checker refuses.
//
// With a verifier, a token above the highest the Store has accepted for the
// lock reaches neither the Store nor the handler until etcd, in a
// linearizable read, shows a key of that lock with that creation revision
// on the lease its name encodes, with no older key of the queue ahead of
// it: the holder (or a reader) as etcd has it. A number no holding of the lock ever had (a
// forged or corrupted token, another lock's, one above etcd's revision)
// therefore neither passes nor raises the fence, on calls and claims alike,
// and the rightful holder's next call passes. A token at or below the
// highest accepted is decided as without a verifier, with no read; a
// confirmed token is remembered, so a holding costs the Checker one read.
//
// Once a claim has passed the interceptor (its handler runs only then), no
// call with a lower token passes the check, and writes made through the
// Store's atomic step with a lower token (fencestore.MemoryStore.Do, or a
// fence.Txn guarded by fencestore.EtcdStore.Guard) are refused. A new holder
// therefore claims before its first read: until its first write the Store's
// highest token is still the previous holder's, and a write of that holder
// still in flight would be accepted after a plain read.
//
// # What is not
//
// A check before the handler runs is not atomic with the handler's write: two
// calls can pass the check in token order and then write in the other order.
// Handlers whose writes must be ordered make them through the Store within the
// same atomic step; with WithCheckInHandler that write is the only check,
// saving a round trip. A stream is checked once, when it opens: its later
// messages are not. A claim shares these limits: a call with a lower token
// that passed the check before the claim may still be running its handler's
// write, and that write is refused only if it goes through the Store's atomic
// step. The token says which lock holding a call came from, not who sent it:
// authenticate clients separately. Without a verifier (a MemoryStore or a
// Store of your own with no WithVerifier, an EtcdStore built
// WithoutVerifier), any well-formed token that is not stale passes and
// raises the fence. A waiter's token (its key queued behind the
// holder's) is refused until its turn comes, and so is a holding whose key
// is gone before its first call.
package fencegrpc
