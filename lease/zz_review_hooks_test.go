package lease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/lease"
)

type rvKey struct{}

type rvCall struct {
	id     int
	c      lease.Call
	mu     sync.Mutex
	events []string
	queued []int
	token  int64
	err    error
	rels   int
}

func (c *rvCall) add(e string) {
	c.mu.Lock()
	c.events = append(c.events, e)
	c.mu.Unlock()
}

type rvRec struct {
	mu    sync.Mutex
	calls []*rvCall
	nilCtx, nilHooks, nilRel bool
	badCtx atomic.Int32
}

func (r *rvRec) hooks() *lease.Hooks {
	return &lease.Hooks{Call: func(ctx context.Context, c lease.Call) (context.Context, *lease.CallHooks) {
		r.mu.Lock()
		cl := &rvCall{id: len(r.calls), c: c}
		r.calls = append(r.calls, cl)
		r.mu.Unlock()
		cl.add("call")
		if r.nilHooks {
			return nil, nil
		}
		var rctx context.Context
		if !r.nilCtx {
			rctx = context.WithValue(ctx, rvKey{}, cl.id)
		}
		return rctx, &lease.CallHooks{
			Queued: func(ahead int) { cl.add(fmt.Sprintf("queued(%d)", ahead)); cl.mu.Lock(); cl.queued = append(cl.queued, ahead); cl.mu.Unlock() },
			Done: func(tok int64, err error) {
				cl.mu.Lock()
				cl.token, cl.err = tok, err
				cl.mu.Unlock()
				cl.add("done")
			},
			Ended: func(held time.Duration, why error) { cl.add("ended:" + lease.Cause(why)) },
			Release: func(ctx context.Context, op string) (context.Context, *lease.CallHooks) {
				cl.mu.Lock()
				cl.rels++
				n := cl.rels
				cl.mu.Unlock()
				cl.add(fmt.Sprintf("release%d:%s", n, op))
				if r.nilRel {
					return nil, nil
				}
				return ctx, &lease.CallHooks{Done: func(tok int64, err error) { cl.add(fmt.Sprintf("reldone%d", n)) }}
			},
		}
	}}
}

func (r *rvRec) all() []*rvCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*rvCall(nil), r.calls...)
}

func (c *rvCall) ev() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.events, " ")
}

// check the documented invariants of one call's events.
func rvCheck(t *testing.T, c *rvCall) {
	t.Helper()
	c.mu.Lock()
	ev := append([]string(nil), c.events...)
	c.mu.Unlock()
	count := func(p string) int {
		n := 0
		for _, e := range ev {
			if strings.HasPrefix(e, p) {
				n++
			}
		}
		return n
	}
	if count("done") != 1 {
		t.Errorf("call %d %v: done %d times: %v", c.id, c.c, count("done"), ev)
	}
	if count("queued") > 1 || count("ended") > 1 {
		t.Errorf("call %d: queued/ended more than once: %v", c.id, ev)
	}
	if count("ended") == 1 && c.err != nil {
		t.Errorf("call %d: ended for a failed call: %v", c.id, ev)
	}
	// Ended (released) must precede the releasing call's done.
	for i, e := range ev {
		if e == "ended:released" {
			for j := 0; j < i; j++ {
				if strings.HasPrefix(ev[j], "reldone") {
					t.Errorf("call %d: ended after release done: %v", c.id, ev)
				}
			}
		}
	}
}

func TestReviewUnlockOrder(t *testing.T) {
	cli := etcd.Client(t)
	r := &rvRec{}
	s := newSession(t, cli, lease.WithHooks(r.hooks()))
	ctx := testCtx(t)
	l, err := s.Lock(ctx, "rv/order")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// second Unlock: already released
	err2 := l.Unlock(ctx)
	t.Logf("second unlock: %v", err2)
	e, err := s.Campaign(ctx, "rv/elect", "v")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range r.all() {
		t.Logf("%v: %s", c.c, c.ev())
		rvCheck(t, c)
	}
}

func TestReviewUnlockCanceledThenAgain(t *testing.T) {
	cli := etcd.Client(t)
	r := &rvRec{}
	s := newSession(t, cli, lease.WithHooks(r.hooks()))
	ctx := testCtx(t)
	l, err := s.Lock(ctx, "rv/cancel")
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	t.Logf("unlock canceled: %v", l.Unlock(cctx))
	t.Logf("unlock again: %v", l.Unlock(ctx))
	for _, c := range r.all() {
		t.Logf("%v: %s", c.c, c.ev())
	}
}

func TestReviewNilReturns(t *testing.T) {
	cli := etcd.Client(t)
	for _, mode := range []string{"nilCtx", "nilHooks", "nilRel"} {
		r := &rvRec{}
		switch mode {
		case "nilCtx":
			r.nilCtx = true
		case "nilHooks":
			r.nilHooks = true
		case "nilRel":
			r.nilRel = true
		}
		s := newSession(t, cli, lease.WithHooks(r.hooks()))
		ctx := testCtx(t)
		l, err := s.Lock(ctx, "rv/nil/"+mode)
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		e, err := s.Campaign(ctx, "rv/nile/"+mode, "v")
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		for _, c := range r.all() {
			t.Logf("%s %v: %s", mode, c.c, c.ev())
		}
	}
}

// ahead counts
func TestReviewAhead(t *testing.T) {
	cli := etcd.Client(t)
	type step struct {
		mode lease.Mode
	}
	cases := []struct {
		name  string
		ahead []lease.Mode // holders/waiters before
		me    lease.Mode
		want  int
	}{
		{"w-behind-w", []lease.Mode{lease.Write}, lease.Write, 1},
		{"w-behind-ww", []lease.Mode{lease.Write, lease.Write}, lease.Write, 2},
		{"r-behind-r", []lease.Mode{lease.Read}, lease.Read, 0},
		{"r-behind-wr", []lease.Mode{lease.Write, lease.Read}, lease.Read, 1},
		{"r-behind-rw", []lease.Mode{lease.Read, lease.Write}, lease.Read, 1},
		{"w-behind-rr", []lease.Mode{lease.Read, lease.Read}, lease.Write, 2},
		{"r-behind-rwr", []lease.Mode{lease.Read, lease.Write, lease.Read}, lease.Read, 2},
	}
	for _, kp := range []bool{false, true} {
		var k *lease.Keeper
		if kp {
			var err error
			k, err = lease.NewKeeper(cli)
			if err != nil {
				t.Fatal(err)
			}
			defer k.Close()
		}
		for _, tc := range cases {
			name := fmt.Sprintf("rv/ahead/%v/%s", kp, tc.name)
			opts := func(o ...lease.Option) []lease.Option {
				if k != nil {
					o = append(o, lease.WithKeeper(k))
				}
				return o
			}
			ctx, cancel := context.WithCancel(testCtx(t))
			for i, m := range tc.ahead {
				s := newSession(t, cli, opts()...)
				go func() {
					if m == lease.Read {
						s.RLock(ctx, name)
					} else {
						s.Lock(ctx, name)
					}
				}()
				waitQueued(t, cli, name, i+1)
			}
			r := &rvRec{}
			s := newSession(t, cli, opts(lease.WithHooks(r.hooks()))...)
			ch := make(chan error, 1)
			go func() {
				var err error
				if tc.me == lease.Read {
					_, err = s.RLock(ctx, name)
				} else {
					_, err = s.Lock(ctx, name)
				}
				ch <- err
			}()
			waitQueued(t, cli, name, len(tc.ahead)+1)
			time.Sleep(300 * time.Millisecond)
			cancel()
			<-ch
			c := r.all()[0]
			c.mu.Lock()
			q := c.queued
			c.mu.Unlock()
			if len(q) != 1 || q[0] != tc.want {
				t.Errorf("keeper=%v %s: queued %v, want %d (%s)", kp, tc.name, q, tc.want, c.ev())
			} else {
				t.Logf("keeper=%v %s: queued %v ok", kp, tc.name, q)
			}
		}
	}
}

func TestReviewTry(t *testing.T) {
	cli := etcd.Client(t)
	r := &rvRec{}
	s1 := newSession(t, cli)
	s := newSession(t, cli, lease.WithHooks(r.hooks()))
	ctx := testCtx(t)
	h, err := s1.Lock(ctx, "rv/try")
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.TryLock(ctx, "rv/try")
	t.Logf("trylock: %v", err)
	_, err = s.TryRLock(ctx, "rv/try")
	t.Logf("tryrlock: %v", err)
	h.Unlock(ctx)
	rh, _ := s1.RLock(ctx, "rv/try")
	_, err = s.TryLock(ctx, "rv/try")
	t.Logf("trylock behind reader: %v", err)
	rl, err := s.TryRLock(ctx, "rv/try")
	t.Logf("tryrlock behind reader: %v", err)
	if rl != nil {
		rl.Unlock(ctx)
	}
	rh.Unlock(ctx)
	_, err = s.Lock(ctx, "bad//name")
	t.Logf("bad name: %v", err)
	_, err = s.Campaign(ctx, "rv/c", lease.ReaderValue)
	t.Logf("campaign reader value: %v", err)
	for _, c := range r.all() {
		t.Logf("%v: %s err=%v", c.c, c.ev(), c.err)
		rvCheck(t, c)
	}
}

// a lock lost right after grant: key deleted from outside as soon as it's put.
func TestReviewLostAfterGrant(t *testing.T) {
	cli := etcd.Client(t)
	name := "rv/lost"
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	go func() {
		wch := cli.Watch(ctx, name+"/", clientv3.WithPrefix())
		for wr := range wch {
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					cli.Delete(context.Background(), string(ev.Kv.Key))
				}
			}
		}
	}()
	time.Sleep(200 * time.Millisecond)
	r := &rvRec{}
	s := newSession(t, cli, lease.WithHooks(r.hooks()))
	for i := 0; i < 30; i++ {
		l, err := s.Lock(ctx, name)
		if err == nil {
			select {
			case <-l.Done():
			case <-time.After(3 * time.Second):
			}
			l.Unlock(ctx)
		}
	}
	time.Sleep(200 * time.Millisecond)
	order := map[string]int{}
	for _, c := range r.all() {
		rvCheck(t, c)
		ev := c.ev()
		if i, j := strings.Index(ev, "ended"), strings.Index(ev, "done"); i >= 0 && i < j {
			order["ended-before-done"]++
			t.Logf("%s", ev)
		} else {
			order[fmt.Sprint(strings.Contains(ev, "ended"))]++
		}
	}
	t.Logf("order: %v", order)
}

func TestReviewStress(t *testing.T) {
	cli := etcd.Client(t)
	k, err := lease.NewKeeper(cli)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	r := &rvRec{}
	var wg sync.WaitGroup
	ctx := testCtx(t)
	for g := 0; g < 12; g++ {
		opts := []lease.Option{lease.WithHooks(r.hooks())}
		if g%2 == 0 {
			opts = append(opts, lease.WithKeeper(k))
		}
		s := newSession(t, cli, opts...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 15; i++ {
				var l *lease.Lock
				var err error
				switch (g + i) % 5 {
				case 0:
					l, err = s.Lock(ctx, "rv/stress")
				case 1:
					l, err = s.RLock(ctx, "rv/stress")
				case 2:
					l, err = s.TryLock(ctx, "rv/stress")
				case 3:
					var e *lease.Leadership
					e, err = s.Campaign(ctx, "rv/stress-e", "v")
					if err == nil {
						e.Resign(ctx)
					}
					continue
				case 4:
					cctx, cancel := context.WithTimeout(ctx, time.Duration(i)*time.Millisecond)
					l, err = s.Lock(cctx, "rv/stress")
					cancel()
				}
				if err == nil {
					l.Unlock(ctx)
				} else if !errors.Is(err, lease.ErrLocked) && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%v", err)
				}
			}
		}()
	}
	wg.Wait()
	time.Sleep(100 * time.Millisecond)
	n := 0
	for _, c := range r.all() {
		rvCheck(t, c)
		n++
	}
	t.Logf("%d calls", n)
}
