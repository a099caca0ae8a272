package holdback

import (
	"context"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Losses makes a client's writes end the way a network can end them after
// etcd applied them, or before it did: a fraction of the client's mutating
// KV requests (Txn, Put, DeleteRange) either
//
//   - are sent, applied by etcd, and their answer dropped: the caller gets
//     gRPC Unavailable, which says nothing about the outcome (an answer
//     lost), or
//   - get Unavailable at once and are sent later, 50 to 500 ms on, by a
//     goroutine of the Losses: applied after the caller gave up, and maybe
//     after the cleanup it sent since (a request sent late), as a proposal
//     a follower forwards late is.
//
// It sits in the client's gRPC path as a unary interceptor (Unary, passed
// in clientv3.Config.DialOptions with grpc.WithChainUnaryInterceptor):
// a cut that sees one request and its answer, so that one answer can be
// dropped and the connection kept. etcd's byte-level fault proxy cannot
// drop one answer without breaking the connection with every call on it.
// The client's own retry interceptor runs outside this one and sends a
// write again only when no connection was there to send it; Unavailable
// with this message is not that, so each fault reaches the caller. Other
// calls (reads, watches, leases) pass untouched.
//
// At most MaxInWindow faults fall in any Window on one Losses (one
// client), so that a caller retrying a write sees at most that many
// failures in a row (within the window) and a bound on how long a grant
// may take can count them. Every loop and wait is bounded.
type Losses struct {
	rate      float64
	window    time.Duration
	maxIn     int
	minDelay  time.Duration
	maxDelay  time.Duration
	sendLimit time.Duration

	mu     sync.Mutex
	rng    *rand.Rand
	recent []time.Time // the times of the last maxIn faults

	on     atomic.Bool
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	lost, late, lateFailed atomic.Int64
}

// LossConfig sets a Losses up; zero fields take the defaults.
type LossConfig struct {
	Seed uint64
	// Rate is the fraction of mutating requests faulted, within the cap
	// below (default 0.3); half the faults lose the answer, half send the
	// request late.
	Rate float64
	// MaxInWindow faults at most in any Window (defaults 2 and 1 s).
	MaxInWindow int
	Window      time.Duration
	// MinDelay to MaxDelay is how late a late request is sent (defaults
	// 50 and 500 ms).
	MinDelay, MaxDelay time.Duration
}

// Mutating KV methods: those a lost answer leaves in doubt.
var mutating = map[string]bool{
	"/etcdserverpb.KV/Txn":         true,
	"/etcdserverpb.KV/Put":         true,
	"/etcdserverpb.KV/DeleteRange": true,
}

// errLost is what a faulted caller gets: Unavailable, which clientv3 does
// not retry for a write and the library counts as outcome unknown.
var errLost = status.Error(codes.Unavailable, "holdback: connection lost before the answer (injected)")

// NewLosses makes a Losses, on: call Stop when the client is done with.
func NewLosses(cfg LossConfig) *Losses {
	if cfg.Rate == 0 {
		cfg.Rate = 0.3
	}
	if cfg.MaxInWindow == 0 {
		cfg.MaxInWindow = 2
	}
	if cfg.Window == 0 {
		cfg.Window = time.Second
	}
	if cfg.MinDelay == 0 {
		cfg.MinDelay = 50 * time.Millisecond
	}
	if cfg.MaxDelay < cfg.MinDelay {
		cfg.MaxDelay = max(cfg.MinDelay, 500*time.Millisecond)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Losses{rate: cfg.Rate, window: cfg.Window, maxIn: cfg.MaxInWindow,
		minDelay: cfg.MinDelay, maxDelay: cfg.MaxDelay, sendLimit: 2 * time.Second,
		rng: rand.New(rand.NewPCG(cfg.Seed, 0x105e)), ctx: ctx, cancel: cancel}
	l.on.Store(true)
	return l
}

// fault picks what happens to one mutating request: nothing, a lost
// answer (late false) or a late send (late true, with its delay).
func (l *Losses) fault() (faulted, late bool, delay time.Duration) {
	if !l.on.Load() {
		return false, false, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if len(l.recent) == l.maxIn && now.Sub(l.recent[0]) < l.window {
		return false, false, 0 // the cap: no more in this window
	}
	if l.rng.Float64() >= l.rate {
		return false, false, 0
	}
	if len(l.recent) == l.maxIn {
		l.recent = l.recent[1:]
	}
	l.recent = append(l.recent, now)
	late = l.rng.IntN(2) == 0
	delay = l.minDelay + time.Duration(l.rng.Int64N(int64(l.maxDelay-l.minDelay)+1))
	return true, late, delay
}

// Unary is the interceptor to chain into the client.
func (l *Losses) Unary() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if !mutating[method] {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		faulted, late, delay := l.fault()
		switch {
		case !faulted:
			return invoker(ctx, method, req, reply, cc, opts...)
		case late:
			l.sendLate(method, req, reply, cc, invoker, delay, opts)
			return errLost
		}
		// Sent and answered; the answer is dropped. A call that failed
		// anyway fails as it did.
		if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
			return err
		}
		l.lost.Add(1)
		return errLost
	}
}

// sendLate sends req after delay on a goroutine of l's, into a reply of
// its own, unless Abort came first. The caller does not change req after
// its call returns (clientv3 builds one per call).
func (l *Losses) sendLate(method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, delay time.Duration, opts []grpc.CallOption) {
	own := reflect.New(reflect.TypeOf(reply).Elem()).Interface()
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-l.ctx.Done():
			return
		}
		ctx, cancel := context.WithTimeout(l.ctx, l.sendLimit)
		defer cancel()
		if invoker(ctx, method, req, own, cc, opts...) != nil {
			l.lateFailed.Add(1)
			return
		}
		l.late.Add(1)
	}()
}

// Stop faults no more requests, then waits until every late request has
// been sent and answered or has failed (at most the longest delay and a
// send's time limit, 2 s).
func (l *Losses) Stop() {
	l.on.Store(false)
	l.wg.Wait()
}

// Abort faults no more requests and drops the late ones not sent yet.
func (l *Losses) Abort() {
	l.on.Store(false)
	l.cancel()
	l.wg.Wait()
}

// LossCounts are what a Losses did: answers dropped of requests etcd
// answered, late requests that etcd answered, and late ones that failed.
type LossCounts struct{ Lost, Late, LateFailed int64 }

// Counts says what l did so far.
func (l *Losses) Counts() LossCounts {
	return LossCounts{l.lost.Load(), l.late.Load(), l.lateFailed.Load()}
}
