// Package fencehttp carries fencing tokens across HTTP: the client side
// attaches a lock's name and token to each request, and a server middleware
// rejects requests whose token is lower than one the service has already
// accepted for that lock.
//
// # Wire format
//
// Two headers, each exactly once: Leasefence-Lock, the lock name, and
// Leasefence-Token, the token in canonical decimal (1 to
// 9223372036854775807, no sign, no leading zeros, no spaces). Anything else
// (a missing header, a repeated one, "007", "-1", "0", " 5", a number that
// overflows int64) is answered 400 with a message saying what is wrong; a
// request is never let through on a header the middleware could not read.
// A stale token is answered 409 with a JSON body naming the token offered
// and the highest accepted, and the Leasefence-Highest header.
//
// # What is guaranteed
//
// The middleware checks and records the token in one atomic step of its
// Store: a Store never accepts a token lower than one it accepted before.
// The lock name a request must carry is decided by the server
// (WithLockName or WithLockNameFunc), never by the client, since a client
// choosing a fresh name would pass any fence.
//
// # What is not
//
// A check before the handler runs is not atomic with the handler's write:
// two requests can pass the check in token order and then write in the
// other order. Handlers whose writes must be ordered make them through the
// Store within the same atomic step: MemoryStore.Do, or a fence.Txn guarded
// by EtcdStore.Guard; with WithCheckInHandler that write is the only check,
// saving a round trip. The token says which lock holding a request came
// from, not who sent it: authenticate clients separately.
package fencehttp
