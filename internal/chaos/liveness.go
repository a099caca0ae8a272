package chaos

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/leasefence/leasefence/lease"
)

// The liveness oracle checks that the locks are live, where the lock
// oracle checks that they are safe: a waiter whose turn has come must be
// granted, or its call must return, soon. A lock that sleeps past its
// turn passes every safety check (nothing is granted wrongly), and for
// the people who run the library it is an outage: the name has no
// holder, and nothing says why.
//
// From etcd's history of the run's lock names (the lock oracle's
// recording, each event dated by when it reached the recorder) and the
// calls the clients made (Wait), it finds each waiter's turn: the first
// revision at which its own key existed, with its token and on its lease,
// and no older key that blocks it remained (the lock oracle's rule:
// blocks, blockers). A key that has left its lease (a put with lease 0)
// is no place in the queue and blocks nothing, so a waiter behind it gets
// its turn at that put. With a lock delay the turn waits for the delay's
// end as well (delayEnd). The property:
//
//	granted or returned by max(turn, faults healed) + B
//
// where the faults healed are those on every client (a stopped leader, a
// cut member, compaction) and those on the waiter's own client (the
// victim's pause), and B is LivenessBound. A call still waiting when the
// run ended counts as returning then: if that is past its deadline, it
// is a stuck waiter.

// Wait is one call of a client that may wait for a lock (Lock, RLock,
// TryLock or TryRLock), as the client saw it.
type Wait struct {
	Client int
	Op     string // "Lock", "RLock", "TryLock", "TryRLock": for reports
	Name   string // the lock's name
	Lease  int64  // the session's lease: the call's key is Name/hex(Lease)
	Mode   lease.Mode
	Call   time.Time // when the call was made
	Return time.Time // when it returned (zero: it had not)
	Token  int64     // the token granted; 0 if the call returned an error
	Err    string    // the error returned; "" if granted
	// SessionLost: the session had ended when the call returned, so the
	// call may have ended only with it (Liveness.SessionSlack).
	SessionLost bool
	// After is the header revision of a linearizable read made after an
	// ungranted call returned and before the session's next call of the
	// name: the key the call put, if any, was created at or before it, and
	// the next call's after it. 0 when unknown (the read failed) or not
	// read (granted, or the run had ended).
	After int64
}

// Key is the call's key: its session's place in the name's queue.
func (w Wait) Key() string { return w.Name + "/" + strconv.FormatInt(w.Lease, 16) }

// outcome says how the call ended, by end (the run's end).
func (w Wait) outcome(end time.Time) string {
	switch {
	case w.Return.IsZero() || w.Return.After(end):
		return "still waiting at the end of the run (" + clock(end) + ")"
	case w.Token != 0:
		return fmt.Sprintf("granted at %s", clock(w.Return))
	}
	return fmt.Sprintf("returned at %s: %s", clock(w.Return), w.Err)
}

// ended is when the call returned, or end if it had not by then, and
// whether it was still waiting at end.
func (w Wait) ended(end time.Time) (time.Time, bool) {
	if w.Return.IsZero() || w.Return.After(end) {
		return end, true
	}
	return w.Return, false
}

func clock(t time.Time) string { return t.Format("15:04:05.000") }

// Liveness is what the check needs of a run besides its history and its
// calls.
type Liveness struct {
	// Bound is B (LivenessBound); SessionSlack is added for a call whose
	// session had ended when it returned: a waiter whose session is lost
	// may learn it only at the session's local deadline, up to a TTL (on
	// the session's clock) after its last renewal.
	Bound, SessionSlack time.Duration
	// DelayTTL is the lease of a lock-delay record as etcd grants it
	// (whole seconds, at least etcd's minimum TTL); 0 when the run's
	// sessions use no lock delay.
	DelayTTL time.Duration
	// End is when the run ended: a call that had not returned by then was
	// still waiting.
	End time.Time
	// Healed is when faults that touch every client had healed (zero:
	// there were none); ClientHealed, when those on one client alone had.
	Healed       time.Time
	ClientHealed map[int]time.Time
}

// The parts of the bound (LivenessBound), from package lease's constants
// and etcd's.
const (
	// backoffCap: package lease's retries back off up to 1 s: the wait
	// loop's reads (lock.go, wait), the lock delay's (delay.go), and a
	// watch's reopening (watch.go, run). They run side by side, and one
	// armed before the heal fires within 1 s of it.
	backoffCap = time.Second
	// catchUp: etcd catches an unsynced watcher up every 100 ms
	// (watchResyncPeriod): a watch that fell behind, and the lock delay's
	// watch of its record, opened at a past revision.
	catchUp = 100 * time.Millisecond
	// grantTrips: round trips from the news to the grant, one after
	// another: the news itself, or a watch reopened (1); the view read
	// again, serializable, then linearizable if the member lagged (2);
	// the own key read the same way (2); a far waiter's re-read after a
	// key it follows went, with its queue watch opened first (2); with a
	// lock delay, the record read and the "held" transaction (2).
	grantTrips = 9
	// scheduling: a loaded machine running -race with runs in parallel
	// (the fast tier runs each fault kind at once on two cores).
	scheduling = 300 * time.Millisecond
	// revokeBatch: etcd's leader revokes expired leases in batches about
	// every 500 ms, so a lease outlives its TTL by up to that.
	revokeBatch = 500 * time.Millisecond
	// minTrip is the round trip assumed on the test's loopback links under
	// load; a run that adds latency passes its own, larger one.
	minTrip = 50 * time.Millisecond
)

// LivenessBound is B for round trips to etcd of up to rtt (at least
// minTrip): what may lie, when the lock has no bug, between the later of
// a waiter's turn and the heal of the faults on its client, and its
// grant or its call's return:
//
//	B = backoffCap + 2 × catchUp + grantTrips × rtt + scheduling
//	  = 1 s + 200 ms + 9 rtt + 300 ms   (1.95 s for rtt = 50 ms)
//
// One catch-up for the news on a watch that fell behind, one for the lock
// delay's watch of its record; the backoffs are armed before the heal and
// run at once, so one cap covers them. A waiter's own session lost adds
// Liveness.SessionSlack. A lock delay moves the turn itself (delayEnd).
func LivenessBound(rtt time.Duration) time.Duration {
	return backoffCap + 2*catchUp + grantTrips*max(rtt, minTrip) + scheduling
}

// LostAnswersAllowance is what a run whose lock clients lose the answers
// of their writes, or send them late (the lostanswers fault kind), adds
// to B, for round trips of up to rtt (at least minTrip) and at most k
// faults in a row on one client. The only writes between a waiter's turn
// and its grant are the lock delay's "held" transaction and its retries
// (delay.go: a loss is recorded before the turn, which the record's end
// moves). Each fault costs the request lost (a round trip), a backoff
// (10 ms, doubling) and the record read again (a round trip) before the
// transaction is sent again:
//
//	2k × rtt + 10 ms × (2^k − 1)   (230 ms for k = 2, rtt = 50 ms)
//
// The calls themselves return at once on a fault (the library withdraws
// an unanswered put, and the liveness oracle counts a return as an end).
func LostAnswersAllowance(rtt time.Duration, k int) time.Duration {
	return time.Duration(2*k)*max(rtt, minTrip) + 10*time.Millisecond*time.Duration(1<<k-1)
}

// LivenessResult is what the liveness check found in one run.
type LivenessResult struct {
	// Checked counts the waiters whose turn came and whose deadline the
	// run reached or whose call had returned: those the property held
	// for, and the stuck ones.
	Checked int
	// Closest is the largest share of its bound that a waiter in time
	// used, from max(turn, healed) to its grant or return: how much
	// headroom the bound left (0.2: a fifth of it used).
	Closest float64
	// Stuck says, for each waiter past its deadline, who it was, its key
	// and token, the keys it was behind and when its turn came.
	Stuck []string
	// Unproven counts calls that could not be matched to their key in the
	// history, and Lost is set when any call could not be checked (or the
	// history has a gap): the run is inconclusive, never passed.
	Unproven int
	Lost     error
}

// ErrLivenessInconclusive is the cause of a LivenessResult.Lost for calls
// that could not be placed in the history.
var ErrLivenessInconclusive = errors.New("liveness oracle: a call could not be matched to its key")

// CheckWaits checks every call in waits against h (complete through a
// revision after p.End, in revision order) and p.
func CheckWaits(h LockHistory, waits []Wait, p Liveness) LivenessResult {
	var res LivenessResult
	for _, calls := range bySession(waits) {
		res.checkSession(h, calls, p)
	}
	if res.Unproven > 0 && res.Lost == nil {
		res.Lost = fmt.Errorf("%w: %d calls", ErrLivenessInconclusive, res.Unproven)
	}
	return res
}

// bySession groups the calls by name and session, each group in the order
// the calls were made (one at a time: a client waits for each), the
// groups in a fixed order.
func bySession(waits []Wait) [][]Wait {
	groups := map[string][]Wait{}
	for _, w := range waits {
		groups[w.Key()] = append(groups[w.Key()], w)
	}
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([][]Wait, 0, len(keys))
	for _, k := range keys {
		calls := groups[k]
		sort.SliceStable(calls, func(i, j int) bool { return calls[i].Call.Before(calls[j].Call) })
		out = append(out, calls)
	}
	return out
}

// checkSession checks one session's calls of one name. Each put the
// key at most once, so the key's incarnations (creation revisions) fall
// to the calls in order: a grant's is its token; an ungranted call's is
// the first after the previous call's (its token, or its After), if
// created by the call's own After. Without an After (a read that
// failed) the calls after it cannot be placed, except the session's
// last, which nothing follows.
func (res *LivenessResult) checkSession(h LockHistory, calls []Wait, p Liveness) {
	incs := incarnations(h, calls[0].Key())
	lower, placed := int64(0), true
	for i, w := range calls {
		if w.Token != 0 {
			lower, placed = w.Token, true
			if !slices.Contains(incs, w.Token) {
				res.Unproven++ // outside the history: the lock oracle says so too
				continue
			}
			res.checkWait(h, w, w.Token, p)
			continue
		}
		_, waiting := w.ended(p.End)
		upper := w.After
		if waiting || (upper == 0 && i == len(calls)-1) {
			upper = math.MaxInt64
		}
		if !placed || upper == 0 {
			res.Unproven++
			placed = false
			continue
		}
		if c, ok := firstIn(incs, lower, upper); ok {
			res.checkWait(h, w, c, p)
		}
		lower = max(lower, w.After)
	}
}

// incarnations are the creation revisions of key in h, in order.
func incarnations(h LockHistory, key string) []int64 {
	var out []int64
	for _, ev := range h.Events {
		if ev.Key == key && !ev.Delete && (len(out) == 0 || out[len(out)-1] != ev.Create) {
			out = append(out, ev.Create)
		}
	}
	return out
}

// firstIn is the first of incs in (lower, upper].
func firstIn(incs []int64, lower, upper int64) (int64, bool) {
	for _, c := range incs {
		if c > lower {
			return c, c <= upper
		}
	}
	return 0, false
}

// checkWait checks call w, whose key was created at c.
func (res *LivenessResult) checkWait(h LockHistory, w Wait, c int64, p Liveness) {
	tn, ok := findTurn(h, w, c)
	if !ok {
		return // its key went (or left its lease) before its turn
	}
	due, ok := delayEnd(h, w.Name, c, tn, p.DelayTTL)
	if !ok {
		return // a lock delay still running when the history ends
	}
	from := latest(due, p.Healed, p.ClientHealed[w.Client])
	bound := p.Bound
	if w.SessionLost {
		bound += p.SessionSlack
	}
	deadline := from.Add(bound)
	end, waiting := w.ended(p.End)
	switch {
	case waiting && !end.After(deadline):
		return // the run ended before its deadline: nothing to say
	case !waiting && w.Token == 0 && end.Before(due):
		return // it gave up before its turn: it was not waiting then
	}
	res.Checked++
	if end.After(deadline) {
		res.Stuck = append(res.Stuck, stuckReport(w, c, tn, due, from, bound, p.End))
		return
	}
	res.Closest = max(res.Closest, float64(end.Sub(from))/float64(bound))
}

func latest(ts ...time.Time) time.Time {
	var t time.Time
	for _, u := range ts {
		if u.After(t) {
			t = u
		}
	}
	return t
}

// turn is when a waiter's turn came: the revision, when it reached the
// recorder, and the keys that blocked the waiter when it queued, each
// with how it stopped blocking.
type turn struct {
	rev    int64
	at     time.Time
	behind []string
}

// findTurn replays h for w's key created at c: the first revision at or
// after c at which the key existed with token c on w's lease and no older
// key blocked it. false if the key went (or changed) first, or the
// history ends before.
func findTurn(h LockHistory, w Wait, c int64) (turn, bool) {
	g := Grant{Client: w.Client, Name: w.Name, Key: w.Key(), Lease: w.Lease, Token: c, Mode: w.Mode}
	state := map[string]LockEvent{}
	var ahead []LockEvent // the keys that blocked it as it queued
	var behind []string
	for i := 0; i < len(h.Events); {
		rev, at := h.Events[i].Rev, h.Events[i].At
		for ; i < len(h.Events) && h.Events[i].Rev == rev; i++ {
			apply(state, w.Name+"/", h.Events[i])
		}
		if rev < c {
			continue
		}
		if ownWhy(state, g) != "" {
			return turn{}, false
		}
		older := blockers(state, g)
		if ahead == nil {
			ahead = append([]LockEvent{}, older...)
		}
		if len(older) == 0 {
			for _, kv := range ahead {
				behind = append(behind, leftAt(h, kv, c))
			}
			return turn{rev: rev, at: at, behind: behind}, true
		}
	}
	return turn{}, false
}

// leftAt says how kv, a key that blocked a waiter queued at c, stopped
// blocking: the first change of it after c.
func leftAt(h LockHistory, kv LockEvent, c int64) string {
	what := fmt.Sprintf("%s (token %d, %s)", kv.Key, kv.Create, strings.TrimSuffix(modeName(kv.Reader), "'s"))
	for _, ev := range h.Events {
		if ev.Rev <= c || ev.Key != kv.Key {
			continue
		}
		switch {
		case ev.Delete:
			return fmt.Sprintf("%s deleted at %d", what, ev.Rev)
		case ev.Create != kv.Create:
			return fmt.Sprintf("%s replaced at %d", what, ev.Rev)
		case ev.Lease != kv.Lease:
			return fmt.Sprintf("%s moved to lease %x at %d", what, ev.Lease, ev.Rev)
		}
	}
	return what
}

// delayState is what a name's lock-delay record means for a waiter whose
// key was created at c (as lease.WithLockDelay reads it).
type delayState int

const (
	delayNone    delayState = iota // no record, a clean release, or this waiter's own holding: no delay
	delayPending                   // "held" by an older holding whose key is gone: a loss, not yet recorded
	delayRunning                   // "lost": the delay runs until etcd expires the record's lease
)

// delayOf reads a record event: "held N D", "lost N D" or "released N"
// (or an older version's "held N", "lost N"); a deletion, or any other
// value, is no record.
func delayOf(ev LockEvent, c int64) delayState {
	fields := strings.Fields(ev.Value)
	if ev.Delete || len(fields) < 2 {
		return delayNone
	}
	word := fields[0]
	token, err := strconv.ParseInt(fields[1], 10, 64)
	switch {
	case err != nil:
		return delayNone
	case word == "lost":
		return delayRunning
	case word == "held" && token < c:
		return delayPending
	}
	return delayNone
}

// delayEnd dates the turn tn of a waiter queued at c on name, with a
// lock delay whose record lease etcd grants for ttl (0: no lock delay).
// A lock delay follows a holding that ended by loss, not release: a
// clean release (Unlock, Close) records "released" in the delete's own
// transaction, a loss leaves "held" with the lost holding's token. At its
// turn the waiter finds the record:
//
//   - no record, "released", or its own holding: no delay, the turn is
//     the revision's time;
//   - "lost" (a loss some waiter recorded), or "held" by an older holding
//     (a loss not yet recorded; the waiter records it under a lease of
//     ttl): the delay ends when the record stops saying so (etcd revokes
//     the lost record's lease), and the turn is then. If the loss was
//     never recorded, the delay would have ended ttl and etcd's revoke
//     batch after the turn, had the waiter recorded it at once: that is
//     the turn. If it was recorded and had not ended when the history
//     ends, the turn has not come (false).
func delayEnd(h LockHistory, name string, c int64, tn turn, ttl time.Duration) (time.Time, bool) {
	if ttl == 0 {
		return tn.at, true
	}
	key := lease.DelayRecordKey(name)
	state, i := delayNone, 0
	for ; i < len(h.Events) && h.Events[i].Rev <= tn.rev; i++ {
		if h.Events[i].Key == key {
			state = delayOf(h.Events[i], c)
		}
	}
	if state == delayNone {
		return tn.at, true
	}
	recorded := state == delayRunning
	for ; i < len(h.Events); i++ {
		if ev := h.Events[i]; ev.Key == key {
			switch delayOf(ev, c) {
			case delayNone:
				return latest(tn.at, ev.At), true
			case delayRunning:
				recorded = true
			}
		}
	}
	if !recorded {
		return tn.at.Add(ttl + revokeBatch), true
	}
	return time.Time{}, false
}

// stuckReport names a stuck waiter, the keys it was behind, its turn and
// its deadline.
func stuckReport(w Wait, c int64, tn turn, due, from time.Time, bound time.Duration, end time.Time) string {
	behind := "no key ahead"
	if len(tn.behind) > 0 {
		behind = "behind " + strings.Join(tn.behind, ", ")
	}
	delayed := ""
	if due.After(tn.at) {
		delayed = fmt.Sprintf(", its lock delay over at %s", clock(due))
	}
	return fmt.Sprintf("stuck waiter: client %d %s of %q, key %s token %d (lease %x), called at %s, %s; its turn came at revision %d (%s)%s; deadline %s (%v after %s); %s",
		w.Client, w.Op, w.Name, w.Key(), c, w.Lease, clock(w.Call), behind, tn.rev, clock(tn.at), delayed,
		clock(from.Add(bound)), bound, clock(from), w.outcome(end))
}

// Waited records a call that may have waited, once it has returned (w's
// After unset). For a call not granted that returned while ctx (the
// run) goes on, it first reads After, linearizably through the oracle's
// client, for up to 5 s: the caller must make the session's next call of
// the name only after Waited returns.
func (o *Oracle) Waited(ctx context.Context, w Wait) {
	if w.Token == 0 && ctx.Err() == nil {
		if rev, err := o.readRevision(ctx, 5*time.Second); err == nil {
			w.After = rev
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.waits = append(o.waits, w)
}

// Liveness checks every call Waited recorded against the history Finish
// completed; it must be called after Finish. A history with a gap, or
// none, makes the result inconclusive.
func (o *Oracle) Liveness(p Liveness) LivenessResult {
	o.mu.Lock()
	h, lost, waits := o.final, o.finalErr, slices.Clone(o.waits)
	o.mu.Unlock()
	switch {
	case h == nil:
		return LivenessResult{Lost: errors.New("liveness oracle: no history (Finish was not called)")}
	case lost != nil:
		return LivenessResult{Lost: lost, Unproven: len(waits)}
	}
	return CheckWaits(*h, waits, p)
}
