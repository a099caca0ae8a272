// Package watch keeps the long-lived etcd watches that serve a lock
// name's locks in turn, and hands what they hear to the locks subscribed.
//
// A Watch counts the stretches of its life in a queue.Epoch: the epoch
// grows by one each time the watch comes up or goes down, so it is odd
// exactly while the watch is up, and everything a watch hands on carries
// the epoch it was sent in. Opened with no start revision, a watch that
// comes up at UpRev reports every change of its range after it, in
// revision order; what a subscriber read before that, or in another
// epoch, may have missed a change. SeenRev is the revision of the last
// response handed on: a subscriber that joins later and reads at least
// that revision misses nothing.
//
// A watch hands on what it hears (Events, Up, Down, Unsubscribed) and
// feeds its Copy in order, one thing at a time, on a goroutine that runs
// only while it has something to hand on. Lock order: a listener may hold
// its own mutex while it calls into a Watch or Follows (to subscribe, say,
// or read an epoch); neither holds a mutex of its own while it calls a
// listener's methods (but Done and Cause, which must take none of the
// listener's) or the Copy. A listener that has ended (Cause not nil) is
// never subscribed again, and a watch stopped for good ends each
// subscription (Unsubscribed) and sends nothing more.
//
// Every watch of an owner (a session, or a Keeper) rides the owner's
// Stream: one gRPC watch stream to etcd, served by two goroutines however
// many watches are open. A watch costs no goroutine of its own. When the
// stream fails, each open watch goes down and comes up again, in a new
// epoch, on the next stream. A paused watch has no etcd watch; RestAfter
// locks in a row that did not need it pause it. Follows keeps a bounded
// set of watches of single keys, closing the least recently used.
package watch
