// Package renew keeps etcd leases alive for package lease: a Renewer
// sends the keep-alives of its sessions, a Keeper's or one lone
// session's, over one LeaseKeepAlive stream, reopening it when it fails.
//
// What it guarantees: each session's keep-alive goes out every third of
// its TTL, and all at once on a new stream; an answer extends the session
// only from its request's send time (Session.Renewed); a session is told
// it is lost (Session.Lose) when etcd reports its lease gone, or at its
// deadline less how late the Renewer's own timer has lately fired (at
// most a quarter of the TTL), so that a process that runs no later than it
// lately has hears of the loss before etcd's expiry. A send blocked by
// the stream's flow control holds up neither the deadline checks nor Add
// and Remove.
//
// Lock order: a Keeper's mu, then the Renewer's mu, then a Session's mu.
package renew
