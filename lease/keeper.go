package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// keeperBatch is how early a Keeper may renew a lease, so that the renewals
// of many sessions go out together: one wake-up of its loop sends every one
// that is due within it. Renewing early is always safe.
const keeperBatch = 100 * time.Millisecond

// Keeper renews the leases of many sessions over one keep-alive stream,
// with one loop and one timer for them all, where each session on its own
// keeps a stream, a loop and a timer of its own. It also shares each
// lock name's queue watch among its sessions: a put or a deletion in a
// queue reaches the process once, however many of its sessions wait there,
// and keeps a copy of the queue in order that their locks wait on: an
// enqueue is a put alone, a deletion wakes only the waiters it grants, and
// they are granted without a read, however long the queue. A name with
// more than 4,096 keys under it has no copy, and its locks read as they
// queue, until it is down to 2,048 keys: the watch counts them meanwhile,
// and then reads the copy again. While nobody else is queued on a name
// (restAfter locks in a row), the watch rests and the name's locks read as
// they queue, as a session's own would, until one has to wait. A service that holds many
// sessions on one client (a session per tenant, per shard or per worker,
// say) makes one Keeper and passes it to each with WithKeeper.
//
// Each session keeps its own conservative deadline, from the send time of
// its own keep-alives, and loses its lease exactly as it would on its own
// stream; the Keeper only shares the stream and the timer. Its methods are
// safe for concurrent use.
type Keeper struct {
	client *clientv3.Client
	cancel context.CancelFunc
	// leaderCtx carries etcd's require-leader metadata: the parent of the
	// shared queue watches.
	leaderCtx context.Context
	renewer   *renewer

	// queues are the lock names' queue watches, each shared by every
	// session of the Keeper that uses the name: one message per deletion
	// reaches the process, however many of its sessions wait on the name.
	queues registry[*keyWatch]

	mu     sync.Mutex // guards closed; taken before renewer.mu
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
	k := &Keeper{client: client, cancel: cancel, leaderCtx: clientv3.WithRequireLeader(ctx)}
	k.queues.open, k.queues.shut = k.openQueue, func(w *keyWatch) { w.stop() }
	k.renewer = newRenewer(ctx, client, clock{}, keeperBatch, time.Second)
	return k, nil
}

// WithKeeper makes the session renew its lease through k, which must be a
// Keeper of the same client. A nil Keeper is refused.
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
// goroutine. A second Close returns ErrSessionClosed.
func (k *Keeper) Close() error {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return failed("keeper", ErrSessionClosed)
	}
	k.closed = true
	k.mu.Unlock()
	var left []*Session
	k.renewer.mu.Lock()
	for _, e := range k.renewer.sessions {
		left = append(left, e.s)
	}
	k.renewer.mu.Unlock()
	var errs []error
	for _, s := range left {
		if err := s.Close(); err != nil && !errors.Is(err, ErrSessionClosed) {
			errs = append(errs, err)
		}
	}
	k.queues.close()
	k.cancel()
	<-k.renewer.done
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

func (k *Keeper) untrack() { k.wg.Done() }

// queueWatch returns name's shared queue watch, started if need be, and
// the function that gives it back.
func (k *Keeper) queueWatch(name string) (*keyWatch, func(), error) {
	w, release, err := k.queues.join(name)
	if err != nil {
		return nil, nil, fmt.Errorf("keeper: %w", err)
	}
	// Launched here, outside the registry's mutex: launching registers
	// the watch's goroutine with the Keeper.
	w.resume()
	return w, release, nil
}

// openQueue starts name's shared queue watch, paused (see queueWatch).
func (k *Keeper) openQueue(name string) (*keyWatch, error) {
	w, err := startWatch(k.leaderCtx, k.client, k, name+"/", true, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	w.mirror = newQueueMirror()
	return w, nil
}

// add starts renewing s's lease, unless the Keeper has closed.
func (k *Keeper) add(s *Session) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return fmt.Errorf("keeper: %w", ErrSessionClosed)
	}
	k.renewer.add(s)
	return nil
}
