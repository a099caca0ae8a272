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
	// AskLease: read how long the record's lease has left (Record.Left),
	// then decide again.
	AskLease
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
// asked (its record's Delay; own if the record does not say), timed by an
// etcd lease from no earlier than the loss. A held record is attached to
// a lease of its session's that is renewed with the session's own and
// outlasts it by the delay asked, so a record whose session has ended
// lapses by itself once its loss is that old; until then, if it lapses
// no later than a fresh lease would, the lock waits for that.
func Next(rec Record, token int64, own time.Duration, reader bool) Step {
	wait := own
	if rec.Delay != Unknown {
		wait = max(wait, rec.Delay)
	}
	switch {
	case rec.State == Clear || rec.State == Released || rec.Token >= token:
		// Nothing to wait out: no record, a clean release, or the
		// lock's own record (a record is never about a later holding).
	case rec.State == Held && rec.Lease != 0 && rec.Delay != Unknown && own <= rec.Delay:
		// Its key is gone (this lock's turn has come), with no release
		// recorded: a loss, timed by the record's own lease if that ends
		// no later than a fresh one would.
		if !rec.LeftKnown {
			return Step{Action: AskLease}
		}
		if rec.Left <= wait {
			return Step{Action: Await}
		}
		return Step{Action: RecordLoss, Delay: wait}
	case rec.State == Held:
		return Step{Action: RecordLoss, Delay: wait}
	case rec.Delay != Unknown && rec.Delay < own:
		// Lost, and waited out for less than this lock's own delay:
		// count it again, from now, for the longer one.
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
