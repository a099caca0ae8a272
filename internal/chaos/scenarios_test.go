package chaos

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/exampleenv"
	"github.com/leasefence/leasefence/internal/seam"
	"github.com/leasefence/leasefence/lease"
)

// Each scenario returns an error describing what went wrong with the
// library (what a mutant must provoke) and fails the test directly only
// for trouble with the test's own machinery. ctx carries the seam hooks.

const ttl = time.Second // etcd's shortest lease with fastTiming

func session(t testing.TB, ctx context.Context, cli *clientv3.Client, d time.Duration) *lease.Session {
	t.Helper()
	s, err := newSession(ctx, cli, lease.WithTTL(d))
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func lock(t testing.TB, ctx context.Context, s *lease.Session, name string) *lease.Lock {
	t.Helper()
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	l, err := s.Lock(lctx, name)
	if err != nil {
		t.Fatalf("Lock(%q): %v", name, err)
	}
	return l
}

// awaitDeleted waits until key is deleted after revision rev.
func awaitDeleted(ctx context.Context, cli *clientv3.Client, key string, rev int64) error {
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for wr := range cli.Watch(wctx, key, clientv3.WithRev(rev)) {
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return nil
			}
		}
	}
	return fmt.Errorf("key %s not deleted within 10s", key)
}

func value(t testing.TB, cli *clientv3.Client, key string) string {
	t.Helper()
	resp, err := cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}

func resourceWrite(ctx context.Context, cli *clientv3.Client, reg string, token int64, val string) error {
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := fence.NewTxn(wctx, seam.KV(wctx, cli), fence.Resource(reg+".fence", token)).Then(clientv3.OpPut(reg, val)).Commit()
	return err
}

// Scenario 0: tokens are creation revisions and grow from one holder to
// the next, even when the sessions were made in the other order and the
// lock was contended.
func scenarioTokens(t testing.TB, ctx context.Context) error {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "tokens")
	var sessions []*lease.Session
	for i := 0; i < 3; i++ {
		sessions = append(sessions, session(t, ctx, cli, 5*time.Second))
	}
	var prev int64
	held := lock(t, ctx, sessions[2], name) // newest session first
	for i := 1; i >= 0; i-- {
		waiting := make(chan *lease.Lock, 1)
		go func() {
			l, err := sessions[i].Lock(ctx, name)
			if err != nil {
				t.Error(err)
			}
			waiting <- l
		}()
		if err := waitQueuedKeys(ctx, cli, name, 2); err != nil {
			t.Fatal(err)
		}
		if err := checkToken(ctx, cli, held, prev); err != nil {
			return err
		}
		prev = held.Token() // the real one: only the one under test is misreported
		held.Unlock(ctx)
		if held = <-waiting; held == nil {
			t.FailNow()
		}
	}
	defer held.Unlock(ctx)
	return checkToken(ctx, cli, held, prev)
}

// checkToken compares the token read off l (seam.ReportedToken: a mutant
// may report another number) with its key's creation revision and with the
// previous holder's.
func checkToken(ctx context.Context, cli *clientv3.Client, l *lease.Lock, prev int64) error {
	token, err := seam.ReportedToken(ctx, cli, l.Key(), l.Token())
	if err != nil {
		return fmt.Errorf("token of %s unreadable: %v", l.Key(), err)
	}
	resp, err := cli.Get(context.Background(), l.Key())
	if err != nil || len(resp.Kvs) != 1 {
		return fmt.Errorf("lock key %s unreadable: %v", l.Key(), err)
	}
	if rev := resp.Kvs[0].CreateRevision; token != rev {
		return fmt.Errorf("token %d is not the key's creation revision %d", token, rev)
	}
	if token <= prev {
		return fmt.Errorf("token %d not above the previous holder's %d", token, prev)
	}
	return nil
}

func waitQueuedKeys(ctx context.Context, cli *clientv3.Client, name string, n int) error {
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	wch := cli.Watch(wctx, name+"/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	<-wch
	for {
		resp, err := cli.Get(wctx, name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return err
		}
		if resp.Count >= int64(n) {
			return nil
		}
		select {
		case <-wch:
		case <-wctx.Done():
			return fmt.Errorf("%d keys never queued under %s", n, name)
		}
	}
}

// Scenario 1: a holder, a child process writing in a loop, is stopped with
// SIGSTOP for 0.5 to 3 TTLs; if a successor takes the lock and writes
// meanwhile, every write the holder starts after SIGCONT is refused.
func scenarioProcessPause(t testing.TB, ctx context.Context, pause time.Duration) (successor bool, err error) {
	cli := etcd.Client(t)
	name, reg := etcdproc.Name(t, "sigstop"), etcdproc.Name(t, "sigstop-reg")
	c, err := exampleenv.StartChild(ctx, "holder", "writer",
		envEndpoints+"="+strings.Join(etcd.Endpoints(), ","), envLock+"="+name, envRegister+"="+reg, envTTL+"="+ttl.String(),
		fmt.Sprintf("%s=%d", envMutant, seam.From(ctx).On()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	lines := c.Lines()
	next := func() string {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("child exited: %v\n%s", c.Wait(), c.Stderr())
			}
			return l
		case <-time.After(10 * time.Second):
			t.Fatalf("child silent for 10s\n%s", c.Stderr())
		}
		return ""
	}
	tokLine := next()
	childToken, _ := strconv.ParseInt(strings.TrimPrefix(tokLine, "LOCKED "), 10, 64)
	for ok := 0; ok < 3; { // the child is writing
		if strings.HasSuffix(next(), " ok") {
			ok++
		}
	}
	c.Signal(syscall.SIGSTOP)
	stoppedAt := time.Now()
	s := session(t, ctx, cli, ttl)
	lctx, cancel := context.WithTimeout(ctx, pause-time.Since(stoppedAt))
	lb, lerr := s.Lock(lctx, name)
	cancel()
	if lerr == nil {
		successor = true
		if lb.Token() <= childToken {
			return true, fmt.Errorf("successor's token %d not above the stopped holder's %d", lb.Token(), childToken)
		}
		if err := resourceWrite(ctx, cli, reg, lb.Token(), "successor"); err != nil {
			return true, fmt.Errorf("successor's write: %w", err)
		}
	}
	// The pause lasts as long as drawn, whatever happened meanwhile.
	<-time.After(time.Until(stoppedAt.Add(pause)))
	c.Signal(syscall.SIGCONT)
	// The child goes on writing with its old token. Once a successor has
	// written, every one of those writes must be refused: wait until three
	// have been (lines from before the stop may come first), then the
	// register must still hold the successor's value, which any accepted
	// late write would have replaced for good.
	for refused, seen := 0, 0; refused < 3 && (successor || seen < 3); {
		f := strings.Fields(next())
		if len(f) != 3 || f[0] != "W" {
			continue
		}
		if seen++; seen > 50 {
			return successor, fmt.Errorf("50 writes after SIGCONT and only %d refused", refused)
		}
		if f[2] == "refused" {
			refused++
		}
	}
	c.Quit(5 * time.Second)
	if successor && value(t, cli, reg) != "successor" {
		return true, fmt.Errorf("register is %q, not the successor's", value(t, cli, reg))
	}
	return successor, nil
}

// Scenario 2: A's guarded transaction is held in the proxy while A's lease
// expires and B writes; released, it fails, since etcd evaluates the guard
// when it applies the transaction.
func scenarioHeldInFlight(t testing.TB, ctx context.Context) error {
	cli := etcd.Client(t)
	p, viaProxy, _ := etcdproc.ProxiedClient(t, etcd.Endpoints()[0])
	name, reg := etcdproc.Name(t, "inflight"), etcdproc.Name(t, "inflight-reg")
	la := lock(t, ctx, session(t, ctx, viaProxy, ttl), name)
	p.PauseTx()
	result := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, err := fence.NewTxn(wctx, seam.KV(wctx, viaProxy), fence.Resource(reg+".fence", la.Token())).Then(clientv3.OpPut(reg, "A")).Commit()
		result <- err
	}()
	if err := awaitDeleted(ctx, cli, la.Key(), la.Token()+1); err != nil {
		t.Fatal(err)
	}
	lb := lock(t, ctx, session(t, ctx, cli, ttl), name)
	if err := resourceWrite(ctx, cli, reg, lb.Token(), "B"); err != nil {
		return fmt.Errorf("B's write: %w", err)
	}
	p.UnpauseTx()
	err := <-result
	if got := value(t, cli, reg); got != "B" {
		return fmt.Errorf("A's held transaction (err %v) overwrote B's value: register is %q", err, got)
	}
	if !errors.Is(err, fence.ErrStale) {
		return fmt.Errorf("A's held transaction: %v, want ErrStale", err)
	}
	return nil
}

// Scenario 3: in one process, A's lock expires and A takes it again with a
// new token; a goroutine still holding the old token writes: refused.
func scenarioTokenReuse(t testing.TB, ctx context.Context) error {
	cli := etcd.Client(t)
	name, reg := etcdproc.Name(t, "reuse"), etcdproc.Name(t, "reuse-reg")
	s1 := session(t, ctx, cli, ttl)
	old := lock(t, ctx, s1, name)
	if _, err := cli.Revoke(ctx, s1.Lease()); err != nil { // the lease ends under A
		t.Fatal(err)
	}
	fresh := lock(t, ctx, session(t, ctx, cli, ttl), name)
	defer fresh.Unlock(ctx)
	if err := resourceWrite(ctx, cli, reg, fresh.Token(), "new"); err != nil {
		return fmt.Errorf("write with the new token: %w", err)
	}
	stale := make(chan error, 1)
	go func() { stale <- resourceWrite(ctx, cli, reg, old.Token(), "old") }()
	if err := <-stale; !errors.Is(err, fence.ErrStale) {
		return fmt.Errorf("write with the old token %d after %d: %v, want ErrStale", old.Token(), fresh.Token(), err)
	}
	_, err := fence.NewTxn(ctx, seam.KV(ctx, cli), fence.Held(old)).Then(clientv3.OpPut(reg, "old")).Commit()
	if !errors.Is(err, fence.ErrNotHeld) {
		return fmt.Errorf("Held write with the old lock: %v, want ErrNotHeld", err)
	}
	if got := value(t, cli, reg); got != "new" {
		return fmt.Errorf("register is %q", got)
	}
	return nil
}

// Scenario 4: Unlock after loss never deletes the successor's key, whether
// the successor is another session or a new lock of the same session; the
// successor's next guarded write succeeds.
func scenarioUnlockAfterLoss(t testing.TB, ctx context.Context) error {
	cli := etcd.Client(t)
	name, reg := etcdproc.Name(t, "unlock-loss"), etcdproc.Name(t, "unlock-loss-reg")
	s := session(t, ctx, cli, 5*time.Second)
	first := lock(t, ctx, s, name)
	if _, err := cli.Delete(ctx, first.Key()); err != nil { // an operator removes the key
		t.Fatal(err)
	}
	select {
	case <-first.Done():
	case <-time.After(5 * time.Second):
		return errors.New("lock not ended 5s after its key was deleted")
	}
	second := lock(t, ctx, s, name) // same session, same key name, new token
	if err := seam.Unlock(ctx, cli, first); !errors.Is(err, lease.ErrLost) {
		return fmt.Errorf("Unlock of the lost lock: %v, want ErrLost", err)
	}
	if _, err := fence.NewTxn(ctx, seam.KV(ctx, cli), fence.Held(second)).Then(clientv3.OpPut(reg, "second")).Commit(); err != nil {
		return fmt.Errorf("successor's guarded write after the stale Unlock: %w", err)
	}
	// Another session's successor.
	s2 := session(t, ctx, cli, 5*time.Second)
	if _, err := cli.Revoke(ctx, s.Lease()); err != nil {
		t.Fatal(err)
	}
	third := lock(t, ctx, s2, name)
	defer third.Unlock(ctx)
	if err := seam.Unlock(ctx, cli, second); !errors.Is(err, lease.ErrLost) {
		return fmt.Errorf("Unlock after the lease was revoked: %v, want ErrLost", err)
	}
	if _, err := fence.NewTxn(ctx, seam.KV(ctx, cli), fence.Held(third)).Then(clientv3.OpPut(reg, "third")).Commit(); err != nil {
		return fmt.Errorf("other session's guarded write after the stale Unlock: %w", err)
	}
	return nil
}

// Scenario 5: with latency injected, the session reports the loss no later
// than etcd expires the lease, and it uses the TTL etcd granted. The
// lease's expiry is seen by a watcher on a probe key attached to it, so the
// comparison holds however the loss comes: the network cut, or the latency
// alone when keep-alives queue behind each other in the proxy.
func scenarioLossBeforeExpiry(t testing.TB, ctx context.Context, cli *clientv3.Client, target string, latency time.Duration) (margin time.Duration, err error) {
	p, viaProxy, _ := etcdproc.ProxiedClient(t, target)
	if latency > 0 {
		p.DelayTx(latency/2, 0)
		p.DelayRx(latency/2, 0)
	}
	s := session(t, ctx, viaProxy, ttl) // asks for 1 s
	ttlResp, terr := cli.TimeToLive(ctx, s.Lease())
	if terr != nil {
		t.Fatal(terr)
	}
	if granted := time.Duration(ttlResp.GrantedTTL) * time.Second; s.TTL() != granted {
		return 0, fmt.Errorf("session TTL %v, etcd granted %v", s.TTL(), granted)
	}
	name := etcdproc.Name(t, "loss")
	probe, perr := cli.Put(ctx, name+"-probe", "", clientv3.WithLease(s.Lease()))
	if perr != nil {
		t.Fatal(perr)
	}
	expired := make(chan time.Time, 1)
	go func() {
		if awaitDeleted(ctx, cli, name+"-probe", probe.Header.Revision+1) == nil {
			expired <- time.Now()
		}
		close(expired)
	}()
	// Hold a lock through the slow link for a TTL, unless the latency alone
	// ends the session first.
	lctx, cancel := context.WithTimeout(ctx, s.TTL())
	l, lerr := s.Lock(lctx, name)
	cancel()
	select {
	case <-time.After(s.TTL()):
	case <-s.Done():
	}
	p.BlackholeTx()
	p.BlackholeRx()
	select {
	case <-s.Done():
	case <-time.After(3 * s.TTL()):
		return 0, errors.New("no local loss within 3 TTLs of the cut")
	}
	lostAt := time.Now()
	if lerr == nil {
		select {
		case <-l.Done():
		case <-time.After(time.Second):
			return 0, errors.New("lock not ended 1s after its session")
		}
	}
	at, ok := <-expired
	if !ok {
		t.Fatal("etcd never expired the lease")
	}
	if at.Before(lostAt) {
		return 0, fmt.Errorf("etcd expired the lease %v before the local loss", lostAt.Sub(at))
	}
	return at.Sub(lostAt), nil
}

// Scenario 6: an answer withheld and the connection dropped: the write
// surfaces as ErrOutcomeUnknown, goes into the history as unknown, and the
// history checks whichever way it went.
func scenarioAmbiguous(t testing.TB, ctx context.Context) error {
	cli := etcd.Client(t)
	p, viaProxy, _ := etcdproc.ProxiedClient(t, etcd.Endpoints()[0])
	name, reg := etcdproc.Name(t, "ambiguous"), etcdproc.Name(t, "ambiguous-reg")
	l := lock(t, ctx, session(t, ctx, cli, 5*time.Second), name)
	defer l.Unlock(ctx)
	h := NewHistory()
	in := Input{Register: reg, Kind: KindResource, Write: true, Token: l.Token(), Value: "v"}
	p.PauseRx() // etcd's answer is held back
	call := h.Now()
	wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err := fence.NewTxn(wctx, seam.KV(wctx, viaProxy), fence.Resource(reg+".fence", l.Token())).Then(clientv3.OpPut(reg, "v")).Commit()
	cancel()
	p.Close() // and the connection dropped
	if !errors.Is(err, fence.ErrOutcomeUnknown) {
		return fmt.Errorf("write with its answer withheld: %v, want ErrOutcomeUnknown", err)
	}
	h.Add(0, in, call, Output{Outcome: Unknown})
	rcall := h.Now()
	got := value(t, cli, reg)
	h.Add(1, Input{Register: reg, Kind: KindResource}, rcall, Output{Value: got})
	if res, _ := h.Check(5 * time.Second); res != "Ok" {
		return fmt.Errorf("history with an unknown write and a read of %q: %s", got, res)
	}
	return nil
}

// Scenario 7: a waiter whose session expires, or whose key is deleted,
// while it is queued gets an error, never a grant; a cancelled acquire
// leaves no key behind after 2 TTLs.
func scenarioWaiterEnds(t testing.TB, ctx context.Context) error {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "waiter")
	holder := lock(t, ctx, session(t, ctx, cli, 5*time.Second), name)

	// Session expires while queued.
	p, viaProxy, _ := etcdproc.ProxiedClient(t, etcd.Endpoints()[0])
	ws := session(t, ctx, viaProxy, ttl)
	got := make(chan error, 1)
	go func() {
		l, err := ws.Lock(ctx, name)
		if err == nil {
			l.Unlock(ctx)
			err = errors.New("granted")
		}
		got <- err
	}()
	if err := waitQueuedKeys(ctx, cli, name, 2); err != nil {
		t.Fatal(err)
	}
	p.BlackholeTx()
	p.BlackholeRx()
	select {
	case err := <-got:
		if !errors.Is(err, lease.ErrLost) {
			return fmt.Errorf("waiter whose session expired: %v, want ErrLost", err)
		}
	case <-time.After(5 * time.Second):
		return errors.New("waiter whose session expired still waiting after 5s")
	}
	p.UnblackholeTx()
	p.UnblackholeRx()
	// The expired waiter's key goes with its lease, which etcd may expire
	// after the waiter has returned: until then it would count as the
	// second key queued below, before the next waiter has queued.
	wsKey := fmt.Sprintf("%s/%x", name, int64(ws.Lease()))
	gone := keyGone(ctx, cli, wsKey)
	if r, err := cli.Get(ctx, wsKey); err != nil {
		return err
	} else if len(r.Kvs) > 0 {
		select {
		case <-gone:
		case <-time.After(10 * time.Second):
			return errors.New("the expired waiter's key outlived its lease by 10s")
		}
	}

	// Key deleted while queued.
	ks := session(t, ctx, cli, 5*time.Second)
	go func() {
		l, err := ks.Lock(ctx, name)
		if err == nil {
			err = fmt.Errorf("granted with token %d while %d holds", l.Token(), holder.Token())
			l.Unlock(ctx)
		}
		got <- err
	}()
	if err := waitQueuedKeys(ctx, cli, name, 2); err != nil {
		t.Fatal(err)
	}
	wkey := fmt.Sprintf("%s/%x", name, int64(ks.Lease()))
	if _, err := cli.Delete(ctx, wkey); err != nil {
		t.Fatal(err)
	}
	holder.Unlock(ctx) // the queue ahead of the deleted waiter empties
	select {
	case err := <-got:
		if !errors.Is(err, lease.ErrKeyDeleted) {
			return fmt.Errorf("waiter whose key was deleted: %v, want ErrKeyDeleted", err)
		}
	case <-time.After(5 * time.Second):
		return errors.New("waiter whose key was deleted still waiting after 5s")
	}

	// Cancelled acquires, at random moments.
	cs := session(t, ctx, cli, ttl)
	blocker := lock(t, ctx, session(t, ctx, cli, 5*time.Second), name)
	for i := 0; i < 5; i++ {
		cctx, cancel := context.WithTimeout(ctx, time.Duration(i)*3*time.Millisecond)
		if l, err := cs.Lock(cctx, name); err == nil {
			l.Unlock(ctx)
		}
		cancel()
	}
	blocker.Unlock(ctx)
	select {
	case <-time.After(2 * ttl):
	case <-ctx.Done():
	}
	if resp, err := cli.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly()); err != nil || len(resp.Kvs) != 0 {
		return fmt.Errorf("keys left 2 TTLs after cancelled acquires: %v %v", resp.Kvs, err)
	}
	return nil
}

// percentile of sorted durations.
func percentile(ds []time.Duration, p float64) time.Duration {
	sorted := append([]time.Duration(nil), ds...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	i := int(float64(len(sorted)-1) * p)
	return sorted[i]
}
