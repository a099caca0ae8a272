package queue

// Epoch numbers the stretches of a watch's life: it grows by one each
// time the watch comes up or goes down, so it is odd exactly while the
// watch is up. News carries the epoch it was sent in, and belongs to that
// stretch and no other: a lock that read the watch up in one epoch knows
// that anything the watch sends in another is not a continuation of it.
type Epoch uint64

// Up tells whether the watch is up in epoch e.
func (e Epoch) Up() bool { return e%2 == 1 }
