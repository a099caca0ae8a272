package lease

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/lease/internal/backoff"
)

// Leader is an election's leader as read from etcd.
type Leader struct {
	// Name is the election's name.
	Name string
	// Key is the leader's key: Name, "/", the leader's lease ID in hex.
	Key string
	// Value is the leader's value, as given to Campaign or Proclaim.
	Value string
	// Token, the creation revision of Key, is the leader's fencing token.
	Token int64
	// Revision is the store revision at which Value was written.
	Revision int64
}

// newer tells whether l is a later leader than prev, or a later value.
func (l Leader) newer(prev Leader) bool {
	return l.Token > prev.Token || (l.Token == prev.Token && l.Revision > prev.Revision)
}

// CurrentLeader reads the leader of the election name, the oldest place in
// its queue, with a linearizable read. It returns an error wrapping
// ErrNoLeader if there is none. It is safe for concurrent use.
func CurrentLeader(ctx context.Context, client *clientv3.Client, name string) (Leader, error) {
	if client == nil {
		return Leader{}, failed(fmt.Sprintf("leader %q", name), errNilClient)
	}
	if err := validateName(name); err != nil {
		return Leader{}, failed(fmt.Sprintf("leader %q", name), err)
	}
	ld, _, err := readLeader(ctx, client, name)
	if err != nil {
		return Leader{}, failed(fmt.Sprintf("leader %q", name), err)
	}
	if ld == nil {
		return Leader{}, failed(fmt.Sprintf("leader %q", name), ErrNoLeader)
	}
	return *ld, nil
}

// readLeader returns the leader of name (nil if none) and the revision of
// its snapshot: every page is read at the first page's revision.
func readLeader(ctx context.Context, client *clientv3.Client, name string) (*Leader, int64, error) {
	pfx := name + "/"
	var rev, minRev int64
	for {
		opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithLimit(queuePage),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev), clientv3.WithMinCreateRev(minRev))
		}
		resp, err := client.Get(ctx, pfx, opts...)
		if err != nil {
			return nil, 0, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			if isQueueKey(pfx, kv) {
				return leaderOf(name, kv), rev, nil
			}
			minRev = kv.CreateRevision + 1
		}
		if !resp.More {
			return nil, rev, nil
		}
	}
}

func leaderOf(name string, kv *mvccpb.KeyValue) *Leader {
	return &Leader{Name: name, Key: string(kv.Key), Value: string(kv.Value), Token: kv.CreateRevision, Revision: kv.ModRevision}
}

// Observer follows the leader of an election. Its methods are safe for
// concurrent use. Leaders delivers each leader, and each new value, in the
// order etcd committed them: each Leader has a larger Token than the one
// before, or the same Token and a larger Revision. A leader that comes and
// goes while the Observer is cut off from etcd, or while nobody reads
// Leaders, may be skipped; the current leader never is.
type Observer struct {
	client *clientv3.Client
	name   string
	ch     chan Leader

	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{}
	once   sync.Once
}

// Observe starts an Observer of the election name, which runs until ctx
// ends or Close. Only bad input fails; an unreachable etcd is retried.
func Observe(ctx context.Context, client *clientv3.Client, name string) (*Observer, error) {
	if client == nil {
		return nil, failed(fmt.Sprintf("observe %q", name), errNilClient)
	}
	if err := validateName(name); err != nil {
		return nil, failed(fmt.Sprintf("observe %q", name), err)
	}
	o := &Observer{client: client, name: name, ch: make(chan Leader), done: make(chan struct{})}
	o.ctx, o.cancel = context.WithCancelCause(ctx)
	go o.run()
	return o, nil
}

// Leaders delivers leaders as they change; closed when the Observer stops.
func (o *Observer) Leaders() <-chan Leader { return o.ch }

// Done is closed when the Observer has stopped and Leaders is closed.
func (o *Observer) Done() <-chan struct{} { return o.done }

// Err is nil while the Observer runs. After Done it is ErrObserverClosed
// after Close, or the cause of ctx's end.
func (o *Observer) Err() error {
	select {
	case <-o.done:
		return context.Cause(o.ctx)
	default:
		return nil
	}
}

// Close stops the Observer and waits for its goroutine; it is idempotent.
func (o *Observer) Close() {
	o.once.Do(func() { o.cancel(ErrObserverClosed) })
	<-o.done
}

func (o *Observer) run() {
	defer close(o.done)
	defer close(o.ch)
	var last Leader
	retry := backoff.New(50*time.Millisecond, time.Second)
	for o.ctx.Err() == nil {
		cur, rev, err := readLeader(o.ctx, o.client, o.name)
		if err != nil {
			_ = retry.Wait(o.ctx) // the loop checks o.ctx
			continue
		}
		retry.Reset()
		if cur != nil && cur.newer(last) {
			if !o.send(*cur) {
				return
			}
			last = *cur
		}
		o.follow(cur, &last, rev+1)
	}
}

// follow watches the election from rev on until the leader must be read
// afresh: it went or may have appeared, or the watch broke or went silent.
func (o *Observer) follow(cur *Leader, last *Leader, rev int64) {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(o.ctx))
	defer cancel()
	pfx := o.name + "/"
	wch := o.client.Watch(ctx, pfx, clientv3.WithPrefix(), clientv3.WithRev(rev))
	silent := time.NewTimer(observerResync)
	defer silent.Stop()
	for {
		var wr clientv3.WatchResponse
		select {
		case r, ok := <-wch:
			if !ok {
				return
			}
			wr = r
		case <-silent.C:
			return
		}
		silent.Reset(observerResync)
		if wr.Err() != nil {
			return
		}
		var ok bool
		if cur, ok = o.apply(pfx, cur, last, wr.Events); !ok {
			return
		}
	}
}

// apply takes one watch response's events, sending on new values of the
// leader's key. It reports false when the leader must be read again.
func (o *Observer) apply(pfx string, cur, last *Leader, evs []*clientv3.Event) (*Leader, bool) {
	for _, ev := range evs {
		leaderKey := cur != nil && string(ev.Kv.Key) == cur.Key
		queued := ev.Type == mvccpb.PUT && isQueueKey(pfx, ev.Kv)
		switch {
		case leaderKey && (!queued || ev.Kv.CreateRevision != cur.Token):
			return nil, false // the leader went, or its key was replaced
		case !queued:
			continue // another key under the name, or a waiter leaving
		case cur == nil:
			return nil, false // a candidate appeared where there was no leader
		case !leaderKey:
			continue // a candidate queued behind the leader
		}
		next := leaderOf(o.name, ev.Kv)
		if next.newer(*last) {
			if !o.send(*next) {
				return nil, false
			}
			*last = *next
		}
		cur = next
	}
	return cur, true
}

func (o *Observer) send(l Leader) bool {
	select {
	case o.ch <- l:
		return true
	case <-o.ctx.Done():
		return false
	}
}
