package delayrec

import "time"

// Action is what a lock whose turn has come does about its name's record.
type Action int

const (
	// Proceed: nothing to wait out, and nothing to record (a reader).
	Proceed Action = iota
	// RecordHeld: record the lock's own holding, with its delay, if the
	// record is still as read; then the lock is done.
	RecordHeld
	// RecordLoss: the holding the record names was lost: record that
	// under a fresh lease of Step.Delay, if the record is still as read.
	RecordLoss
	// Await: a loss is being waited out; wait until the record changes.
	Await
)

// Step is an Action and, for RecordLoss, how long the loss is waited out.
type Step struct {
	Action Action
	Delay  time.Duration
}

// Next decides what a lock with the given token, whose turn has come,
// does about rec, its name's record. own is the lock's session's delay:
// what it asks of its successors and the least it waits out after a loss
// of a predecessor. reader: a reader never records its own holding.
//
// A loss is waited out for the longer of own and what the lost holding
// asked (its record's Delay; own if the record does not say), timed by a
// fresh etcd lease from when the lock learned of it, never before the
// loss. A held record whose session has ended lapses by itself once its
// loss is about as old as the delay it asked; a lock that finds it still
// there counts from now all the same, as etcd may shorten the gap between
// the two leases' ends (a leader change spreads out crowded expiries).
func Next(rec Record, token int64, own time.Duration, reader bool) Step {
	wait := own
	if rec.Delay != Unknown {
		wait = max(wait, rec.Delay)
	}
	switch {
	case rec.State == Clear || rec.State == Released || rec.Token >= token:
		// Nothing to wait out: no record, a clean release, or the
		// lock's own record (a record is never about a later holding).
	case rec.State == Held:
		// Its key is gone (this lock's turn has come), with no release
		// recorded: a loss.
		return Step{Action: RecordLoss, Delay: wait}
	case rec.Delay < own:
		// Lost, and waited out for less than this lock's own delay, or
		// for a delay the record does not say (an older version's:
		// Unknown is below any delay): count it again, from now, for
		// this lock's.
		return Step{Action: RecordLoss, Delay: wait}
	default: // Lost
		return Step{Action: Await}
	}
	if reader {
		// Readers wait out a loss they find, but never record their own
		// holding: they change nothing a delay would protect.
		return Step{Action: Proceed}
	}
	return Step{Action: RecordHeld}
}
