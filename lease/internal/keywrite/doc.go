// Package keywrite makes a session's writes of its lock keys that etcd
// may apply late: the put of a lock key, the withdrawal of a put etcd did
// not answer, and the removal of a key such a put left. Package lease
// sends every other write.
//
// What it guarantees: a copy of one of these writes applied however late
// (a proposal a follower forwarded after the client gave up, even after
// the lock's cleanup) never deletes or changes a later holding's key,
// nor another client's key on the session's lease; a put with no
// definite answer is withdrawn before Put returns, so it leaves no key
// that holds up the name while the session lives, unless etcd refuses
// the withdrawal outright or keeps refusing it (the key then stays until
// the session's next lock of the name, or its end); and a marker someone
// deleted, or a restore brought back, strands no name, unless etcd has
// compacted the history that tells the session's own key from another
// client's (Config.InUse until the session ends).
//
// Each lock key has a marker, a key of the library's own on the session's
// lease, that every put compares and moves: writes.go states the rules,
// lease/writes.go lists every write of the library with its guard. The
// writes reach the session only through Session.
//
// The build tag leasefence_mutants plants issue 46's defects in these
// writes (Mutation), for lease's write model to show that it catches each.
package keywrite
