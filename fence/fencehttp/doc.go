// Package fencehttp carries fencing tokens across HTTP: the client side
// attaches a lock's name and token to each request, and a server middleware
// rejects requests whose token is lower than one the service has already
// accepted for that lock.
//
// # Wire format
//
// Two headers, each exactly once: Leasefence-Lock, the lock name, and
// Leasefence-Token, the token in canonical decimal (1 to 9223372036854775807,
// no sign, no leading zeros, no spaces). Anything else (a missing header, a
// repeated one, "007", "-1", "0", " 5", a number that overflows int64) is
// answered 400 with a message saying what is wrong; a request is never let
// through on a header the middleware could not read. A stale token is answered
// 409 with a JSON body naming the token offered and the highest accepted, and
// the Leasefence-Highest header. A token the verifier did not confirm as the
// live holder's of the lock (WithVerifier, or an EtcdStore, which verifies by
// default) is answered 403, with etcd's revision when it was asked in the
// body and the Leasefence-Revision header (CheckResponse turns it into a
// *fence.UnverifiedError); a verifier that could not ask etcd gives 503.
//
// A third header, Leasefence-Claim, makes a request a claim (AttachClaim). Its
// only value is "1", given once, with the two fencing headers; any other value
// ("true", "0"), a repeated header, a claim without the fencing headers, or a
// claim on a request the server does not fence is answered 400. A claim is
// always checked and its token recorded before the handler runs, whatever the
// method (methods that pass unchecked included) and even with
// WithCheckInHandler: a GET with a claim is "claim, then read" in one round
// trip. A stale claim is answered 409 like any stale request. A request
// without the header is checked, or not, by its method alone.
//
// # What is guaranteed
//
// The middleware checks and records the token in one atomic step of its Store:
// a Store never accepts a token lower than one it accepted before. The lock
// name a request must carry is decided by the server (WithLockName or
// WithLockNameFunc), never by the client, since a client choosing a fresh name
// would pass any fence.
//
// With a verifier, a token above the highest the Store has accepted for the
// lock reaches neither the Store nor the handler until etcd, in a
// linearizable read, shows a key of that lock with that creation revision
// on the lease its name encodes, with no older key of the queue ahead of
// it: the holder (or a reader) as etcd has it. A number no holding of the lock ever had (a
// forged or corrupted header, another lock's token, one above etcd's
// revision) therefore neither passes nor raises the fence, on requests and
// claims alike, and the rightful holder's next request passes. A token at
// or below the highest accepted is decided as without a verifier, with no
// read; a confirmed token is remembered, so a holding costs the middleware
// one read.
//
// Once a claim has passed the middleware (its handler runs only then), no
// request with a lower token passes the middleware's check, and writes made
// through the Store's atomic step with a lower token
// (fencestore.MemoryStore.Do, or a fence.Txn guarded by
// fencestore.EtcdStore.Guard) are refused. A new holder therefore claims
// before its first read. A plain read at the start of a holding is not enough:
// reads write nothing, so until the new holder's first write the Store's
// highest token is still the previous holder's, and a write of that holder
// still in flight is accepted after the read. The new holder then builds on a
// state that has changed under it, and its own write undoes the late one.
//
// # What is not
//
// A check before the handler runs is not atomic with the handler's write: two
// requests can pass the check in token order and then write in the other
// order. Handlers whose writes must be ordered make them through the Store
// within the same atomic step: fencestore.MemoryStore.Do, or a fence.Txn
// guarded by fencestore.EtcdStore.Guard; with WithCheckInHandler that write is
// the only check, saving a round trip. A claim shares this limit: a request
// with a lower token that passed the middleware's check before the claim may
// still be running its handler's write when the claim is answered, and that
// write is refused only if it goes through the Store's atomic step. The token
// says which lock holding a request came from, not who sent it: authenticate
// clients separately. Without a verifier (a MemoryStore or a Store of your
// own with no WithVerifier, an EtcdStore built WithoutVerifier), any
// well-formed token that is not stale passes and raises the fence. A
// waiter's token (its key queued behind the holder's) is refused until
// its turn comes, and so is a holding whose key is gone before its first
// request.
package fencehttp
