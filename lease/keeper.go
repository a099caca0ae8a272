package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/lease/internal/renew"
	"github.com/leasefence/leasefence/lease/internal/watch"
)

// Keeper renews the leases of many sessions of one client together, and
// lets their locks of one name share what they hear from etcd, so that a
// change in a queue reaches the process once, however many of its sessions
// wait there. A service with many sessions on one client (one per tenant,
// shard or worker, say) makes one Keeper and passes it to each with
// WithKeeper. Each session still loses its lease exactly as it would on its
// own, and its locks give the same guarantees. Its methods are safe for
// concurrent use.
type Keeper struct {
	client *clientv3.Client
	cancel context.CancelFunc
	// stream carries the queue watches; it ends with the Keeper.
	stream  *watch.Stream
	renewer *renew.Renewer

	// queues holds one queue watch per name, shared by the sessions.
	queues registry[*sharedQueue]

	mu     sync.Mutex // guards closed; taken before the renewer's mu (renew.Renewer)
	closed bool
	wg     sync.WaitGroup // the queue watches' goroutines
}

// NewKeeper starts a Keeper for client. A nil client gives an error
// wrapping ErrInvalidArgument. Close stops it.
func NewKeeper(client *clientv3.Client) (*Keeper, error) {
	if client == nil {
		return nil, failed("keeper", errNilClient)
	}
	ctx, cancel := context.WithCancel(context.Background())
	k := &Keeper{client: client, cancel: cancel}
	k.stream = watch.NewStream(clientv3.WithRequireLeader(ctx), client, (*keeperOwner)(k))
	k.queues.open, k.queues.shut = k.openQueue, func(q *sharedQueue) { q.w.Stop() }
	k.renewer = renew.New(ctx, client, clock{}, keeperBatch, time.Second)
	return k, nil
}

// WithKeeper makes the session renew its lease through k, a Keeper of the
// same client; a nil Keeper or another client's gives ErrInvalidArgument.
func WithKeeper(k *Keeper) Option {
	return func(o *options) error {
		if k == nil {
			return fmt.Errorf("%w: nil Keeper", ErrInvalidArgument)
		}
		o.keeper = k
		return nil
	}
}

// Close stops the Keeper, first closing every session still renewed
// through it (their locks end with ErrSessionClosed). It waits for its
// goroutines. A second Close returns an error wrapping ErrSessionClosed.
func (k *Keeper) Close() error {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return failed("keeper", ErrSessionClosed)
	}
	k.closed = true
	k.mu.Unlock()
	var left []*Session
	for _, e := range k.renewer.Sessions() {
		left = append(left, e.(kept).s)
	}
	var errs []error
	for _, s := range left {
		if err := s.Close(); err != nil && !errors.Is(err, ErrSessionClosed) {
			errs = append(errs, err)
		}
	}
	k.queues.close()
	k.cancel()
	<-k.renewer.Done()
	k.wg.Wait()
	return errors.Join(errs...)
}

// track registers a queue watch's goroutine, until the Keeper closes.
func (k *Keeper) track() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return fmt.Errorf("keeper: %w", ErrSessionClosed)
	}
	k.wg.Add(1)
	return nil
}

// keeperOwner is a Keeper as the owner of its queue watches' goroutines
// (watch.Owner).
type keeperOwner Keeper

func (o *keeperOwner) Track() error { return (*Keeper)(o).track() }

func (o *keeperOwner) Untrack() { o.wg.Done() }

// sharedQueue is a name's queue watch shared by a Keeper's sessions, and
// the copy of the queue it keeps.
type sharedQueue struct {
	w      *watch.Watch
	mirror *queueMirror
}

// queueWatch returns name's queue watch, started if need be, its copy of
// the queue, and its release.
func (k *Keeper) queueWatch(name string) (*watch.Watch, *queueMirror, func(), error) {
	q, release, err := k.queues.join(name)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("keeper: %w", err)
	}
	// Outside the registry's mutex: launching registers the watch's
	// goroutine with the Keeper (k.mu).
	q.w.Resume()
	return q.w, q.mirror, release, nil
}

// openQueue starts name's shared queue watch, paused (see queueWatch).
func (k *Keeper) openQueue(name string) (*sharedQueue, error) {
	m := newQueueMirror(name + "/")
	w, err := watch.Start(watch.Config{Stream: k.stream, Key: name + "/", Prefix: true,
		Copy: m, Paused: true, RestAfter: restAfter})
	if err != nil {
		return nil, err
	}
	return &sharedQueue{w: w, mirror: m}, nil
}

// add starts renewing s's lease, unless the Keeper has closed.
func (k *Keeper) add(s *Session) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return fmt.Errorf("keeper: %w", ErrSessionClosed)
	}
	k.renewer.Add(kept{s})
	return nil
}
