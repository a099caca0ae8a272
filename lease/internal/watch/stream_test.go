package watch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease/internal/queue"
)

// owner counts a stream's goroutines.
type owner struct{ wg sync.WaitGroup }

func (o *owner) Track() error { o.wg.Add(1); return nil }
func (o *owner) Untrack()     { o.wg.Done() }

// recorder is a Listener that records what it hears, and fails the first
// failUps calls of Up.
type recorder struct {
	ctx context.Context

	mu      sync.Mutex
	failUps int
	ups     int
	downs   int
	keys    []string // keys of the events heard
	upc     chan struct{}
	onUp    func() // called (once) at the first Up, before it answers
}

func newRecorder(ctx context.Context) *recorder {
	return &recorder{ctx: ctx, upc: make(chan struct{}, 100)}
}

func (r *recorder) Events(_ *Watch, _ queue.Source, evs []*mvccpb.Event, _ queue.Epoch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range evs {
		r.keys = append(r.keys, string(ev.Kv.Key))
	}
}

func (r *recorder) Up(context.Context, *Watch, queue.Source, queue.Epoch, int64) error {
	r.mu.Lock()
	r.ups++
	fail := r.failUps > 0
	if fail {
		r.failUps--
	}
	onUp := r.onUp
	r.onUp = nil
	r.mu.Unlock()
	if onUp != nil {
		onUp()
	}
	if fail {
		return errors.New("cannot catch up")
	}
	r.upc <- struct{}{}
	return nil
}

func (r *recorder) Down(queue.Source, queue.Epoch) {
	r.mu.Lock()
	r.downs++
	r.mu.Unlock()
}

func (r *recorder) Unsubscribed(*Watch)            {}
func (r *recorder) Done() <-chan struct{}          { return r.ctx.Done() }
func (r *recorder) Cause() error                   { return context.Cause(r.ctx) }
func (r *recorder) SubscribeTo(*Watch) queue.Epoch { return 0 }

func (r *recorder) heard() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.keys...)
}

// waitUp waits until r hears a successful Up.
func (r *recorder) waitUp(t *testing.T, what string, d time.Duration) {
	t.Helper()
	select {
	case <-r.upc:
	case <-time.After(d):
		t.Fatalf("%s: not up within %v", what, d)
	}
}

// member starts one etcd process of the test's own, which it may kill.
func member(t *testing.T) (*etcdproc.Proc, *clientv3.Client) {
	t.Helper()
	ctx := etcdproc.Ctx(t, 5*time.Minute)
	bin, err := etcdproc.Binary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := etcdproc.StartProcesses(ctx, bin, t.TempDir(), 1, 100, 1000)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.Members[0], etcdproc.Client(t, c.Endpoints())
}

// streamT makes a stream that ends, and is waited for, when the test ends.
func streamT(t *testing.T, cli *clientv3.Client) *Stream {
	ctx, cancel := context.WithCancel(context.Background())
	o := &owner{}
	s := NewStream(clientv3.WithRequireLeader(ctx), cli, o)
	t.Cleanup(func() { cancel(); o.wg.Wait() })
	return s
}

func subscribe(w *Watch, r *recorder) {
	w.Subscribe(r, false, func() queue.Source { return 1 })
}

// A watch that had to start over once (a listener could not catch up)
// still comes up again after the stream fails and is opened anew.
func TestWatchUpAgainAfterRestartAndStreamFailure(t *testing.T) {
	etcdproc.LeakCheck(t)
	proc, cli := member(t)
	s := streamT(t, cli)
	r := newRecorder(context.Background())
	r.failUps = 1
	w, err := Start(Config{Stream: s, Key: "k", Paused: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	subscribe(w, r)
	w.Resume()
	r.waitUp(t, "after one failed Up", 10*time.Second)

	proc.Kill()
	if err := proc.Restart(etcdproc.Ctx(t, time.Minute)); err != nil {
		t.Fatal(err)
	}
	r.waitUp(t, "after etcd restarted", 20*time.Second)
}

// A retry that falls due while the stream is down creates nothing: on the
// next stream, each create's answer goes to its own watch.
func TestRetryWhileStreamDownDoesNotMisroute(t *testing.T) {
	etcdproc.LeakCheck(t)
	proc, cli := member(t)
	s := streamT(t, cli)
	a, b := newRecorder(context.Background()), newRecorder(context.Background())
	wa, err := Start(Config{Stream: s, Key: "a", Paused: true})
	if err != nil {
		t.Fatal(err)
	}
	defer wa.Stop()
	wb, err := Start(Config{Stream: s, Key: "b", Paused: true})
	if err != nil {
		t.Fatal(err)
	}
	defer wb.Stop()
	subscribe(wa, a)
	subscribe(wb, b)
	wb.Resume()
	b.waitUp(t, "b", 10*time.Second)

	// a's first Up fails, and etcd dies just after: a starts over after
	// its backoff (50 ms), which falls due while the stream is down.
	killed := make(chan struct{})
	a.failUps = 1
	a.onUp = func() {
		go func() {
			defer close(killed)
			time.Sleep(10 * time.Millisecond)
			proc.Kill()
		}()
	}
	wa.Resume()
	<-killed
	// Wait for a's retry to fall due with the stream down: no stream, no
	// creation of a, and no retry pending.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		due := s.live == nil && wa.reg == nil && wa.retryAt == nil
		s.mu.Unlock()
		if due {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a's retry did not fall due with the stream down in 10 s")
		}
	}
	if err := proc.Restart(etcdproc.Ctx(t, time.Minute)); err != nil {
		t.Fatal(err)
	}
	a.waitUp(t, "a after etcd restarted", 20*time.Second)

	ctx := etcdproc.Ctx(t, 10*time.Second)
	for _, k := range []string{"a", "b"} {
		if _, err := cli.Put(ctx, k, "v"); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && (len(a.heard()) == 0 || len(b.heard()) == 0) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := fmt.Sprint(a.heard(), b.heard()); got != "[a] [b]" {
		t.Fatalf("a heard, b heard = %s, want [a] [b]", got)
	}
	b.waitUp(t, "b after etcd restarted", time.Second)
}

// Pause and Resume at once leave the watch either paused or open, never
// neither (unpaused with no etcd watch wanted, which nothing reopens).
func TestPauseResumeRace(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli, _ := etcdproc.Unanswered(t)
	s := streamT(t, cli)
	w, err := Start(Config{Stream: s, Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for i := range 20000 {
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); w.Pause() }()
		go func() { defer wg.Done(); w.Resume() }()
		wg.Wait()
		w.Resume()
		s.mu.Lock()
		_, open := s.open[w]
		s.mu.Unlock()
		if !w.Paused() && !open {
			t.Fatalf("round %d: the watch is neither paused nor open", i)
		}
	}
}

// TestCreatedAnswerOutOfOrderResetsStream: a created answer that gives a
// watch ID other than the one the oldest unanswered create asked for (what
// a server that answers creates out of order would send) is not routed:
// route reports it, and the stream starts over. A refusal (ID -1) still
// goes to the oldest create, and one in order is routed to its watch.
func TestCreatedAnswerOutOfOrderResetsStream(t *testing.T) {
	s := NewStream(context.Background(), nil, &owner{})
	a, b := &Watch{stream: s, key: "a"}, &Watch{stream: s, key: "b"}
	s.mu.Lock()
	s.live = &link{poke: make(chan struct{}, 1)}
	s.createLocked(a)
	s.createLocked(b)
	ida, idb := a.reg.id, b.reg.id
	s.mu.Unlock()
	if ida == idb {
		t.Fatalf("two creates asked for the same watch ID %d", ida)
	}
	ans := func(id int64, refused bool) *pb.WatchResponse {
		return &pb.WatchResponse{Header: &pb.ResponseHeader{Revision: 5}, WatchId: id, Created: true, Canceled: refused}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, _, ok := s.routeLocked(ans(idb, false)); ok || w != nil {
		t.Fatalf("b's answer while a's is due: routed to %v, ok %v; want refused", w, ok)
	}
	if w, it, ok := s.routeLocked(ans(-1, true)); !ok || w != a || !it.down {
		t.Fatalf("a refusal: routed to %v (down %v), ok %v; want a's down", w, it.down, ok)
	}
	if w, it, ok := s.routeLocked(ans(idb, false)); !ok || w != b || it.resp == nil {
		t.Fatalf("b's answer in order: routed to %v, ok %v; want b", w, ok)
	}
	if a.retryAt != nil {
		a.retryAt.Stop()
	}
}

// StartOver takes a watch still up in the epoch given down and up again
// in a later epoch, delivering what changed meanwhile; given an epoch the
// watch has left, it does nothing.
func TestStartOver(t *testing.T) {
	etcdproc.LeakCheck(t)
	_, cli := member(t)
	s := streamT(t, cli)
	r := newRecorder(context.Background())
	w, err := Start(Config{Stream: s, Key: "k", Paused: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	subscribe(w, r)
	w.Resume()
	r.waitUp(t, "first", 10*time.Second)
	first := w.Epoch()
	w.StartOver(first)
	r.waitUp(t, "after StartOver", 10*time.Second)
	again := w.Epoch()
	if again <= first || !again.Up() {
		t.Fatalf("after StartOver(%d) the watch is in epoch %d, want a later one, up", first, again)
	}
	w.StartOver(first) // gone by: nothing happens
	if _, err := cli.Put(context.Background(), "k", "v"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); len(r.heard()) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the put after a stale StartOver was not heard in 10 s")
		}
	}
	r.mu.Lock()
	ups, downs := r.ups, r.downs
	r.mu.Unlock()
	if ups != 2 || downs != 1 || w.Epoch() != again {
		t.Fatalf("ups %d, downs %d, epoch %d: want 2, 1 and %d (a stale StartOver restarted the watch)", ups, downs, w.Epoch(), again)
	}
}
