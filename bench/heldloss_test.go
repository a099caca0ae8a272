package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// deletionBound is how soon after another client's delete of its key is
// answered a held lock's Done must close, with its own-key watch up. The
// lease doc promises "as soon as etcd's watch delivers the deletion";
// measured on one host that is about 50 µs, and the bound leaves room for
// a loaded machine.
const deletionBound = time.Second

// TestDeletionsAmongManyHeld holds 100,000 locks on one session (10,000
// under the race detector, and with -short), has another client delete
// 100 of their keys chosen at random, all at once, and checks that each of
// those holders' Done closes within deletionBound of its delete's answer,
// with ErrKeyDeleted, and that no other holder is disturbed: each is still
// held, and its key still there, once every deleted holder has ended and
// a last deletion, sent after the 100 were answered, has been seen too
// (events routed to the wrong lock would end it, or leave a deleted
// holder open). The deletions start as soon as the own-key watches are
// up: the reads they make as they come up may still be going on. etcd
// runs in a process of its own, fsync off.
func TestDeletionsAmongManyHeld(t *testing.T) {
	n := 100_000
	if raceOn || testing.Short() {
		n = 10_000
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := etcdproc.Start(ctx, etcdproc.Config{NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var r requests
	cli := newClient(t, c.Endpoints()[0], &r)
	other := newClient(t, c.Endpoints()[0], &requests{})
	s, err := lease.NewSession(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	prefix := etcdproc.Name(t, "held")
	locks := make([]*lease.Lock, n)
	created := r.created.Load()
	start := time.Now()
	if err := forEach(n, true, func(j int) (err error) {
		locks[j], err = s.Lock(ctx, fmt.Sprintf("%s/%d", prefix, j))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d locks taken concurrently in %v", n, time.Since(start).Round(time.Millisecond))
	// A lock granted at once opens its own-key watch 50 ms later: the
	// bound holds from then.
	for deadline := time.Now().Add(time.Minute + time.Duration(n)*time.Millisecond); r.created.Load()-created < int64(n); {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d own-key watches up after the deadline", r.created.Load()-created, n)
		}
		time.Sleep(10 * time.Millisecond)
	}

	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	picked := rand.New(rand.NewPCG(uint64(seed), 0)).Perm(n)[:100]
	seen := deleteAndWait(ctx, t, other, locks, picked)
	slices.Sort(seen)
	t.Logf("Done after the delete's answer, 100 deletions at once among %d held: p50 %v, p99 %v, max %v",
		n, seen[len(seen)/2], seen[len(seen)*99/100], seen[len(seen)-1])

	// A last deletion, sent after the 100 were answered, seen too.
	last, err := s.Lock(ctx, prefix+"/last")
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); r.created.Load()-created < int64(n+1); {
		if time.Now().After(deadline) {
			t.Fatal("the last lock's own-key watch did not come up in 10 s")
		}
		time.Sleep(time.Millisecond)
	}
	deleteAndWait(ctx, t, other, []*lease.Lock{last}, []int{0})
	undisturbed(ctx, t, other, prefix, locks, picked)
}

// deleteAndWait deletes the keys of locks[picked...] through other, all
// at once, and returns for each how long after its delete's answer the
// lock's Done closed; each must close within deletionBound, with
// ErrKeyDeleted.
func deleteAndWait(ctx context.Context, t *testing.T, other *clientv3.Client, locks []*lease.Lock, picked []int) []time.Duration {
	t.Helper()
	seen := make([]time.Duration, len(picked))
	errs := make([]error, len(picked))
	var wg sync.WaitGroup
	for i, j := range picked {
		wg.Go(func() {
			l := locks[j]
			if _, err := other.Delete(ctx, l.Key()); err != nil {
				errs[i] = err
				return
			}
			answered := time.Now()
			select {
			case <-l.Done():
				seen[i] = time.Since(answered)
			case <-time.After(deletionBound):
				errs[i] = fmt.Errorf("lock %d (%s): Done still open %v after its key's delete was answered", j, l.Key(), deletionBound)
				return
			}
			if !errors.Is(l.Err(), lease.ErrKeyDeleted) {
				errs[i] = fmt.Errorf("lock %d: Err = %v, want ErrKeyDeleted", j, l.Err())
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return seen
}

// undisturbed checks that every lock but the picked ones is still held
// and its key still in etcd under its token.
func undisturbed(ctx context.Context, t *testing.T, other *clientv3.Client, prefix string, locks []*lease.Lock, picked []int) {
	t.Helper()
	gone := make(map[int]bool, len(picked))
	for _, j := range picked {
		gone[j] = true
	}
	resp, err := other.Get(ctx, prefix+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	tokens := make(map[string]int64, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		tokens[string(kv.Key)] = kv.CreateRevision
	}
	disturbed := 0
	for j, l := range locks {
		if gone[j] {
			continue
		}
		select {
		case <-l.Done():
			disturbed++
			t.Errorf("lock %d (%s) ended: %v", j, l.Key(), l.Err())
			continue
		default:
		}
		if tokens[l.Key()] != l.Token() {
			disturbed++
			t.Errorf("lock %d: key %s has token %d in etcd, the lock %d", j, l.Key(), tokens[l.Key()], l.Token())
		}
		if disturbed > 10 {
			t.Fatal("more than 10 other holders disturbed")
		}
	}
}
