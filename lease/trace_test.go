package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// calls records what the tracing hooks hear, call by call.
type calls struct {
	mu     sync.Mutex
	events map[string][]string // by op and name: "queued 2", "done", "release", "ended released", "release done"
	queued chan int
}

func newCalls() *calls { return &calls{events: map[string][]string{}, queued: make(chan int, 16)} }

func (c *calls) add(key, ev string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events[key] = append(c.events[key], ev)
}

func (c *calls) of(key string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events[key])
}

func (c *calls) hooks() *lease.Hooks {
	return &lease.Hooks{Call: func(ctx context.Context, call lease.Call) (context.Context, *lease.CallHooks) {
		key := call.Op + " " + call.Name
		return ctx, &lease.CallHooks{
			Queued: func(ahead int) {
				c.add(key, fmt.Sprint("queued ", ahead))
				c.queued <- ahead
			},
			Done: func(_ int64, err error) { c.add(key, fmt.Sprint("done ", err == nil)) },
			Release: func(ctx context.Context, op string) (context.Context, *lease.CallHooks) {
				c.add(key, op)
				return ctx, &lease.CallHooks{Done: func(_ int64, err error) { c.add(key, fmt.Sprint(op, " done ", err == nil)) }}
			},
			Ended: func(_ time.Duration, why error) { c.add(key, "ended "+lease.Cause(why)) },
		}
	}}
}

// Queued counts the keys ahead that block the call, on a session of its
// own and on a Keeper's, whose waiters wait on the Keeper's copy of the
// queue: writers and readers ahead of a writer, writers alone ahead of a
// reader.
func TestQueuedCountsKeysAhead(t *testing.T) {
	cli := etcd.Client(t)
	k, err := lease.NewKeeper(cli)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	cases := []struct {
		name  string
		ahead []lease.Mode
		me    lease.Mode
		want  int
	}{
		{"w-behind-w", []lease.Mode{lease.Write}, lease.Write, 1},
		{"w-behind-ww", []lease.Mode{lease.Write, lease.Write}, lease.Write, 2},
		{"w-behind-rr", []lease.Mode{lease.Read, lease.Read}, lease.Write, 2},
		{"r-behind-r", []lease.Mode{lease.Read}, lease.Read, 0},
		{"r-behind-rwr", []lease.Mode{lease.Read, lease.Write, lease.Read}, lease.Read, 1},
		{"w-behind-wwww", []lease.Mode{lease.Write, lease.Write, lease.Write, lease.Write}, lease.Write, 4},
	}
	take := func(ctx context.Context, s *lease.Session, m lease.Mode, name string) error {
		var err error
		if m == lease.Read {
			_, err = s.RLock(ctx, name)
		} else {
			_, err = s.Lock(ctx, name)
		}
		return err
	}
	for _, keeper := range []bool{false, true} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("keeper=%v/%s", keeper, tc.name), func(t *testing.T) {
				var opts []lease.Option
				if keeper {
					opts = append(opts, lease.WithKeeper(k))
				}
				name := etcdproc.Name(t, "queued")
				ctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
				var wg sync.WaitGroup
				defer wg.Wait()
				defer cancel()
				for i, m := range tc.ahead {
					s := newSession(t, cli, opts...)
					wg.Go(func() { take(ctx, s, m, name) })
					waitQueued(t, cli, name, i+1)
				}
				c := newCalls()
				s := newSession(t, cli, append(opts, lease.WithHooks(c.hooks()))...)
				wg.Go(func() { take(ctx, s, tc.me, name) })
				select {
				case got := <-c.queued:
					if got != tc.want {
						t.Errorf("queued with %d ahead, want %d", got, tc.want)
					}
				case <-ctx.Done():
					t.Fatal("never queued")
				}
			})
		}
	}
}

// The order the hooks hear a holding in: Queued, Done, then for an Unlock
// Release, the holding's Ended, and the release's Done; an Unlock of a
// lock already released is heard as a release that failed, with no
// second Ended.
func TestCallHooksOrder(t *testing.T) {
	cli := etcd.Client(t)
	ctx := etcdproc.Ctx(t, 30*time.Second)
	c := newCalls()
	s := newSession(t, cli, lease.WithHooks(c.hooks()))
	name := etcdproc.Name(t, "order")
	l, err := s.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); !errors.Is(err, lease.ErrUnlocked) {
		t.Fatalf("second Unlock: %v", err)
	}
	if _, err := s.TryLock(ctx, name+"/"); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Fatalf("TryLock of a bad name: %v", err)
	}
	want := []string{"queued 0", "done true", "Unlock", "ended released", "Unlock done true", "Unlock", "Unlock done false"}
	if got := c.of("Lock " + name); !slices.Equal(got, want) {
		t.Errorf("heard %q, want %q", got, want)
	}
	if got, want := c.of("TryLock "+name+"/"), []string{"done false"}; !slices.Equal(got, want) {
		t.Errorf("bad name: heard %q, want %q", got, want)
	}
}
