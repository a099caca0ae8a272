package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/lease"
)

// The lock oracle checks the grants themselves, where porcupine checks
// the data: a fence hides a wrong grant (the second holder's writes are
// refused or ordered), so a lock that grants too early would pass every
// data check. The oracle replays etcd's own history of the keys under a
// lock's name and asks whether, at some revision between the call and the
// grant, the library's rule held: the lock's own key existed with its
// token on its session's lease, and no older key that blocks it did.

// LockEvent is one change of a key under the recorded prefix, as etcd's
// watch delivered it (or, for keys that existed when recording started,
// as the first read found them).
type LockEvent struct {
	Rev    int64 // the revision of the change
	Key    string
	Delete bool
	Create int64 // the key's creation revision (puts only)
	Lease  int64
	Reader bool   // the value is a reader's (lease.ReaderValue)
	Value  string // the value put (puts only): the liveness oracle reads lock-delay records
	// At is the local time the event reached the recorder (for keys found
	// by the first read, the time of that read's answer): no earlier than
	// the revision was committed, so a turn dated by it is never early.
	At time.Time
}

// LockHistory is everything that happened under a prefix from Start (the
// revision of the first read, whose keys are events at Start) through
// Through, in revision order. Past Through nothing is known.
type LockHistory struct {
	Start, Through int64
	Events         []LockEvent
}

// Grant is one lock a client was handed: what Lock (RLock, TryLock, ...)
// returned, and Upper, a revision read after it returned.
type Grant struct {
	Client int
	Name   string // the lock's name
	Key    string // its own key
	Lease  int64  // its session's lease
	Token  int64
	Mode   lease.Mode
	Upper  int64
}

func (g Grant) String() string {
	return fmt.Sprintf("client %d %s of %q key %s token %d lease %x, window [%d, %d]",
		g.Client, g.Mode, g.Name, g.Key, g.Token, g.Lease, g.Token, g.Upper)
}

// ErrInconclusive is CheckGrant's answer when the history does not cover
// the grant's window: nothing can be said either way.
var ErrInconclusive = errors.New("lock oracle: history does not cover the grant")

// CheckGrant tells whether g was a valid grant according to h: nil if at
// some revision r in [g.Token, g.Upper] (after every change at r) the own
// key existed with creation revision g.Token on lease g.Lease and no older
// queue key under g.Name blocked it; an error saying why not otherwise.
//
// The window's lower end is the token: the own key is put by the call, so
// its creation revision comes after the call began. The upper end must be
// at least the revision the library decided at; a larger one only makes
// the check weaker, a smaller one would make it wrong.
func CheckGrant(h LockHistory, g Grant) error {
	if err := g.wellFormed(); err != nil {
		return err
	}
	if g.Token <= h.Start || g.Upper > h.Through {
		return fmt.Errorf("%w: window [%d, %d], history (%d, %d]", ErrInconclusive, g.Token, g.Upper, h.Start, h.Through)
	}
	pfx := g.Name + "/"
	state := map[string]LockEvent{}
	var first, last string
	for i := 0; i < len(h.Events) && h.Events[i].Rev <= g.Upper; {
		rev := h.Events[i].Rev
		for ; i < len(h.Events) && h.Events[i].Rev == rev; i++ {
			apply(state, pfx, h.Events[i])
		}
		if rev < g.Token {
			continue
		}
		why := blockedBy(state, g)
		if why == "" {
			return nil
		}
		if first == "" {
			first = fmt.Sprintf("at %d %s", rev, why)
		}
		last = fmt.Sprintf("at %d %s", rev, why)
	}
	if first == "" {
		return fmt.Errorf("invalid grant (%s): no change under %s in the window: its key was never put at the token", g, pfx)
	}
	if last != first {
		first += "; last " + last
	}
	return fmt.Errorf("invalid grant (%s): %s", g, first)
}

// wellFormed checks what a grant says of itself: its key is its session's
// place in its name's queue, and its upper bound is not before its token
// (a revision read after the grant precedes the key's creation only if
// the token is not that creation).
func (g Grant) wellFormed() error {
	if want := g.Name + "/" + strconv.FormatInt(g.Lease, 16); g.Key != want {
		return fmt.Errorf("invalid grant (%s): key is not %s", g, want)
	}
	if g.Upper < g.Token {
		return fmt.Errorf("invalid grant (%s): a revision read after the grant is before the token", g)
	}
	return nil
}

// apply changes state by one event, if the event is under pfx.
func apply(state map[string]LockEvent, pfx string, ev LockEvent) {
	if !strings.HasPrefix(ev.Key, pfx) {
		return
	}
	if ev.Delete {
		delete(state, ev.Key)
		return
	}
	state[ev.Key] = ev
}

// blockedBy is why g is not held in state ("" if it is): its own key
// missing or not its own, or the oldest older key that blocks it.
func blockedBy(state map[string]LockEvent, g Grant) string {
	if why := ownWhy(state, g); why != "" {
		return why
	}
	if older := blockers(state, g); len(older) > 0 {
		oldest := older[0]
		return fmt.Sprintf("older %s key %s (token %d) exists", modeName(oldest.Reader), oldest.Key, oldest.Create)
	}
	return ""
}

// ownWhy is why g's own key is not its holding in state: missing, of
// another token, or on another lease ("" if it is).
func ownWhy(state map[string]LockEvent, g Grant) string {
	own, ok := state[g.Key]
	switch {
	case !ok:
		return "its own key does not exist"
	case own.Create != g.Token:
		return fmt.Sprintf("its own key has token %d", own.Create)
	case own.Lease != g.Lease:
		return fmt.Sprintf("its own key is on lease %x", own.Lease)
	}
	return ""
}

// blockers are the keys in state older than g's token that block it,
// oldest first.
func blockers(state map[string]LockEvent, g Grant) []LockEvent {
	var older []LockEvent
	for _, kv := range state {
		if kv.Create < g.Token && blocks(g.Name+"/", g.Mode, kv) {
			older = append(older, kv)
		}
	}
	sort.Slice(older, func(i, j int) bool { return older[i].Create < older[j].Create })
	return older
}

// blocks is the library's rule (lease's isQueueKey and Lock.blocks, copied
// so that a bug there is not also the oracle's): only a place in the
// queue counts, a key one level under the name, named after the lease it
// is on, in lowercase hex; any such key blocks a writer, only a writer's
// (a value other than lease.ReaderValue) blocks a reader.
func blocks(pfx string, mode lease.Mode, kv LockEvent) bool {
	rest, ok := strings.CutPrefix(kv.Key, pfx)
	if !ok || rest == "" || strings.Contains(rest, "/") || kv.Lease == 0 || rest != strconv.FormatInt(kv.Lease, 16) {
		return false
	}
	return mode == lease.Write || !kv.Reader
}

func modeName(reader bool) string {
	if reader {
		return "reader's"
	}
	return "writer's"
}

// waitedAtToken tells whether the writer's grant g had to wait: whether
// some other key under its name outlived its put. It is worked out here
// by a plain scan of the history, apart from CheckGrant, whose verdict on
// the grant forged as decided at its own put (Oracle.Finish's control)
// must then be "invalid": if it is not, the oracle's replay or its rule
// misses what the scan sees, and a real early grant would pass too.
func waitedAtToken(h LockHistory, g Grant) bool {
	if g.Mode != lease.Write {
		return false
	}
	live := map[string]bool{}
	for _, ev := range h.Events {
		if ev.Rev > g.Token {
			break
		}
		if strings.HasPrefix(ev.Key, g.Name+"/") && ev.Key != g.Key {
			live[ev.Key] = !ev.Delete
		}
	}
	for _, on := range live {
		if on {
			return true
		}
	}
	return false
}

// Oracle records the history under a prefix and the grants of the locks
// under it, and checks every grant once the run is over. Its watch is
// opened before any client starts and reopened after any break from the
// revision after the last one it delivered: kept open, it delivers
// everything even across compactions; reopened too late, it is refused
// as compacted, and the history is marked lost rather than checked with
// a gap.
type Oracle struct {
	cli    *clientv3.Client
	prefix string
	stop   context.CancelFunc
	done   chan struct{}
	bounds sync.WaitGroup

	mu      sync.Mutex
	changed chan struct{}
	hist    LockHistory
	lost    error // the history has a gap
	grants  []Grant
	missing int // grants whose upper bound could not be read
	// The liveness oracle's (liveness.go): every call that may have
	// waited, and the history as Finish completed it (final), with the
	// reason it has a gap, if it has one (finalErr).
	waits    []Wait
	final    *LockHistory
	finalErr error
}

// StartOracle starts watching prefix through cli, which should reach
// members that the run's faults leave together with a leader (a watch on
// a cut-off member is ended and reopened elsewhere), and reads what is
// under it. The watch is opened first, at etcd's current revision, and
// the read made once etcd has created it: a watch opened at a past
// revision waits for etcd's catch-up loop, and a compaction meanwhile
// (another run's, on a shared member) refuses it. The read, made after,
// is at a revision at least the watch's, and the watch's events up to
// the read's revision are dropped: the read already has them.
func StartOracle(ctx context.Context, cli *clientv3.Client, prefix string) (*Oracle, error) {
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	var (
		wch    clientv3.WatchChan
		cancel context.CancelFunc
		resp   *clientv3.GetResponse
		err    error
	)
	// A member that has lost its leader (an earlier run's partition, on a
	// shared pool) refuses the watch until one is elected: try again.
	for {
		var first context.Context
		first, cancel = context.WithCancel(clientv3.WithRequireLeader(wctx))
		lo, hi := watchedRange(prefix)
		wch = cli.Watch(first, lo, clientv3.WithRange(hi), clientv3.WithCreatedNotify())
		if resp, err = startRead(ctx, cli, prefix, wch); err == nil {
			break
		}
		cancel()
		if !errors.Is(err, rpctypes.ErrNoLeader) || ctx.Err() != nil {
			stop()
			return nil, err
		}
		rest(ctx, 50*time.Millisecond)
	}
	at := time.Now()
	o := &Oracle{cli: cli, prefix: prefix, done: make(chan struct{}), changed: make(chan struct{}), stop: stop,
		hist: LockHistory{Start: resp.Header.Revision, Through: resp.Header.Revision}}
	for _, kv := range resp.Kvs {
		if !recorded(prefix, string(kv.Key)) {
			continue
		}
		o.hist.Events = append(o.hist.Events, LockEvent{Rev: resp.Header.Revision, Key: string(kv.Key),
			Create: kv.CreateRevision, Lease: kv.Lease, Reader: string(kv.Value) == lease.ReaderValue,
			Value: string(kv.Value), At: at})
	}
	go o.follow(wctx, wch, cancel, resp.Header.Revision+1)
	return o, nil
}

// startRead waits for etcd to create the watch wch, then reads prefix.
func startRead(ctx context.Context, cli *clientv3.Client, prefix string, wch clientv3.WatchChan) (*clientv3.GetResponse, error) {
	select {
	case wr, ok := <-wch:
		switch {
		case !ok:
			return nil, errors.New("lock oracle: the watch closed before it was created")
		case wr.Err() != nil:
			return nil, fmt.Errorf("lock oracle: the watch: %w", wr.Err())
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	lo, hi := watchedRange(prefix)
	return cli.Get(ctx, lo, clientv3.WithRange(hi))
}

// watchedRange is the range of keys the oracle watches for prefix: the
// names' queues and the lock-delay records of those names, which lie
// under the library's own prefix, outside every queue, and sort before
// any printable name. recorded picks the two out of it.
func watchedRange(prefix string) (lo, hi string) {
	return lease.DelayRecordKey(prefix), clientv3.GetPrefixRangeEnd(prefix)
}

// recorded tells whether key, in the watched range, is one the history
// records: under prefix, or a lock-delay record of a name under it.
func recorded(prefix, key string) bool {
	return strings.HasPrefix(key, prefix) || strings.HasPrefix(key, lease.DelayRecordKey(prefix))
}

// follow keeps the watch open, from next on, until ctx ends or the
// history is lost: it takes what wch delivers, then reopens the watch
// after a short pause from the revision after the last it delivered, as
// often as it ends. cancel ends wch's opening.
func (o *Oracle) follow(ctx context.Context, wch clientv3.WatchChan, cancel context.CancelFunc, next int64) {
	defer close(o.done)
	for {
		var ok bool
		next, ok = o.drain(wch, next)
		cancel()
		if !ok || ctx.Err() != nil {
			return
		}
		rest(ctx, 50*time.Millisecond)
		// It requires a leader, so that a member cut off from the quorum
		// ends it instead of leaving it silent.
		var wctx context.Context
		wctx, cancel = context.WithCancel(clientv3.WithRequireLeader(ctx))
		lo, hi := watchedRange(o.prefix)
		wch = o.cli.Watch(wctx, lo, clientv3.WithRange(hi), clientv3.WithRev(next))
	}
}

// drain takes one opening's events from next on, and returns where the
// next opening starts, or false if etcd refused it as compacted.
func (o *Oracle) drain(wch clientv3.WatchChan, next int64) (int64, bool) {
	for wr := range wch {
		if wr.CompactRevision != 0 {
			o.fail(fmt.Errorf("the watch reopened at %d after etcd compacted through %d (history from %d)",
				next, wr.CompactRevision, o.start()))
			return next, false
		}
		if wr.Err() != nil {
			return next, true
		}
		if n := len(wr.Events); n > 0 {
			o.add(wr.Events, next)
			next = max(next, wr.Events[n-1].Kv.ModRevision+1)
		}
	}
	return next, true
}

func (o *Oracle) start() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.hist.Start
}

// add records the events at from and after, dated now: as they arrived.
func (o *Oracle) add(evs []*clientv3.Event, from int64) {
	at := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, ev := range evs {
		if ev.Kv.ModRevision < from || !recorded(o.prefix, string(ev.Kv.Key)) {
			continue
		}
		e := LockEvent{Rev: ev.Kv.ModRevision, Key: string(ev.Kv.Key), Delete: ev.Type == clientv3.EventTypeDelete, At: at}
		if !e.Delete {
			e.Create, e.Lease, e.Value = ev.Kv.CreateRevision, ev.Kv.Lease, string(ev.Kv.Value)
			e.Reader = e.Value == lease.ReaderValue
		}
		o.hist.Events = append(o.hist.Events, e)
		o.hist.Through = max(o.hist.Through, e.Rev)
	}
	close(o.changed)
	o.changed = make(chan struct{})
}

func (o *Oracle) fail(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.lost == nil {
		o.lost = err
	}
	close(o.changed)
	o.changed = make(chan struct{})
}

// Granted records that client was handed l on s, and reads the grant's
// upper bound: the header revision of a linearizable read sent after the
// grant returned. etcd answers such a read at a revision at least its
// commit index when the read arrived, and every revision the library
// could have seen before Lock returned was committed by then; so the
// revision the grant was decided at is at most the bound. The read goes
// through the oracle's client, away from the client's own faults, so that
// the bound is as close to the grant as it can be; Finish waits for it.
func (o *Oracle) Granted(client int, s *lease.Session, l *lease.Lock) {
	o.GrantedAs(Grant{Client: client, Name: l.Name(), Key: l.Key(), Lease: int64(s.Lease()), Token: l.Token(), Mode: l.Mode()})
}

// GrantedAs is Granted for a grant described by g (its Upper unset), as
// a child process reports it: the bound is read once the report is in,
// which is after its Lock returned.
func (o *Oracle) GrantedAs(g Grant) {
	o.bounds.Add(1)
	go func() {
		defer o.bounds.Done()
		upper, err := o.readRevision(context.Background(), 15*time.Second)
		o.mu.Lock()
		defer o.mu.Unlock()
		if err != nil {
			o.missing++
			return
		}
		g.Upper = upper
		o.grants = append(o.grants, g)
	}()
}

// readRevision makes a linearizable read, again after a failure, for up
// to d, and returns its header revision.
func (o *Oracle) readRevision(ctx context.Context, d time.Duration) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		rctx, stop := context.WithTimeout(ctx, time.Second)
		resp, err := o.cli.Get(rctx, o.prefix, clientv3.WithCountOnly())
		stop()
		if err == nil {
			return resp.Header.Revision, nil
		}
		if ctx.Err() != nil {
			return 0, err
		}
		rest(ctx, 50*time.Millisecond)
	}
}

// rest waits d or until ctx ends: a pause between tries, not a wait
// for an event.
func rest(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

// OracleResult is what the oracle found in one run.
type OracleResult struct {
	Grants   int      // grants checked
	Readers  int      // of which read holdings
	Invalid  []string // why each invalid grant was invalid
	Lost     error    // set when the run's grants could not all be checked: inconclusive
	Unproven int      // grants left unchecked (no upper bound, or outside the history)
	// Forged controls: grants that had to wait, forged as decided at
	// their own put; each must be found invalid.
	Forged, Flagged int
}

// Stop stops the watch, if Finish has not: for a run that ends early.
func (o *Oracle) Stop() { o.stop() }

// Finish waits for the upper bounds, then puts a key under the prefix
// and waits until the watch has delivered it: the history is then
// complete through a revision after every bound. It checks every grant and
// stops the watch.
func (o *Oracle) Finish(ctx context.Context) OracleResult {
	o.bounds.Wait()
	defer func() {
		o.stop()
		<-o.done
	}()
	var res OracleResult
	if err := o.sync(ctx); err != nil {
		res.Lost = err
	}
	o.mu.Lock()
	h, grants := o.hist, o.grants
	h.Events = append([]LockEvent(nil), o.hist.Events...)
	res.Unproven = o.missing
	sort.SliceStable(h.Events, func(i, j int) bool { return h.Events[i].Rev < h.Events[j].Rev })
	o.final, o.finalErr = &h, res.Lost
	if res.Lost == nil && o.missing > 0 {
		res.Lost = fmt.Errorf("%d grants without an upper bound", o.missing)
	}
	o.mu.Unlock()
	for _, g := range grants {
		res.check(h, g)
	}
	return res
}

// check checks one grant and, if it had to wait, its forged early twin.
func (res *OracleResult) check(h LockHistory, g Grant) {
	err := CheckGrant(h, g)
	switch {
	case errors.Is(err, ErrInconclusive):
		res.Unproven++
		if res.Lost == nil {
			res.Lost = err
		}
		return
	case err != nil:
		res.Invalid = append(res.Invalid, err.Error())
	}
	res.Grants++
	if g.Mode == lease.Read {
		res.Readers++
	}
	if err == nil && waitedAtToken(h, g) {
		res.Forged++
		forged := g
		forged.Upper = g.Token
		if err := CheckGrant(h, forged); err != nil && !errors.Is(err, ErrInconclusive) {
			res.Flagged++
		}
	}
}

// sync puts the sentinel and waits, for up to 15 s, until the history
// reaches it. The sentinel is no place in any queue (it has no lease).
func (o *Oracle) sync(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	var rev int64
	for rev == 0 {
		pctx, stop := context.WithTimeout(ctx, time.Second)
		resp, err := o.cli.Put(pctx, o.prefix+"oracle-sync", "")
		stop()
		switch {
		case err == nil:
			rev = resp.Header.Revision
		case ctx.Err() != nil:
			return fmt.Errorf("the sentinel could not be put: %w", err)
		default:
			rest(ctx, 50*time.Millisecond)
		}
	}
	for {
		o.mu.Lock()
		through, lost, changed := o.hist.Through, o.lost, o.changed
		o.mu.Unlock()
		switch {
		case lost != nil:
			return lost
		case through >= rev:
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("the watch reached %d, not the sentinel's %d, within 15s", through, rev)
		}
	}
}

// Story tells what the history Finish completed holds of key, and the
// calls Waited recorded on it, in time order: for a report that names a
// key left behind. Times are from the first event of the history.
func (o *Oracle) Story(key string) string {
	o.mu.Lock()
	h, waits := o.final, slices.Clone(o.waits)
	o.mu.Unlock()
	if h == nil {
		return "no history"
	}
	var start time.Time
	if len(h.Events) > 0 {
		start = h.Events[0].At
	}
	type line struct {
		at   time.Time
		text string
	}
	var lines []line
	for _, ev := range h.Events {
		switch {
		case ev.Key != key:
		case ev.Delete:
			lines = append(lines, line{ev.At, fmt.Sprintf("rev %d deleted", ev.Rev)})
		default:
			lines = append(lines, line{ev.At, fmt.Sprintf("rev %d put (created %d, lease %x)", ev.Rev, ev.Create, ev.Lease)})
		}
	}
	for _, w := range waits {
		if w.Key() != key {
			continue
		}
		out := fmt.Sprintf("token %d", w.Token)
		if w.Err != "" {
			out = fmt.Sprintf("error %q (revision after: %d)", w.Err, w.After)
		}
		lines = append(lines, line{w.Call, fmt.Sprintf("%s by client %d called", w.Op, w.Client)})
		if !w.Return.IsZero() {
			lines = append(lines, line{w.Return, fmt.Sprintf("%s by client %d returned %s", w.Op, w.Client, out)})
		}
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].at.Before(lines[j].at) })
	var b strings.Builder
	for _, l := range lines {
		fmt.Fprintf(&b, "\n\t\t%8.3fs %s", l.at.Sub(start).Seconds(), l.text)
	}
	return b.String()
}
