package lease

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// gate is one name's turn on a session: locks of one name through one
// session would share one etcd key, so they take turns through this
// one-place channel. It also keeps the name's watches, which outlive the
// last user by idleWatch.
type gate struct {
	ch chan struct{}
	w  watches
}

// watches are a name's long-lived watches on a session (keyWatch). The
// queue watch is the session's own, or shared by its Keeper's sessions
// (shared set; release gives it back).
type watches struct {
	own, queue *keyWatch
	follows    *follows
	shared     *Keeper
	release    func()
}

func (w watches) stop() {
	w.own.stop()
	w.follows.stop()
	if w.shared != nil {
		w.release()
	} else {
		w.queue.stop()
	}
}

// openGate makes name's gate and starts its watches, for its first user.
func (s *Session) openGate(name string) (*gate, error) {
	// Paused: a lock granted at once opens it after ownWatchDelay.
	own, err := s.startWatch(lockKey(name, s.id), true)
	if err != nil {
		return nil, err
	}
	w := watches{own: own, follows: &follows{s: s}, shared: s.keeper}
	if s.keeper != nil {
		w.queue, w.release, err = s.keeper.queueWatch(name)
	} else {
		w.queue, err = s.startWatch(name+"/", true, clientv3.WithPrefix())
	}
	if err != nil {
		own.stop()
		return nil, err
	}
	return &gate{ch: make(chan struct{}, 1), w: w}, nil
}

// enterGate takes the gate of name, waiting for it unless try is set, and
// returns the name's watches and a function that gives the gate back.
func (s *Session) enterGate(ctx context.Context, name string, try bool) (watches, func(), error) {
	g, leave, err := s.gates.join(name)
	if err != nil {
		return watches{}, nil, err
	}
	release := func() {
		<-g.ch
		leave()
	}
	if try {
		select {
		case g.ch <- struct{}{}:
			return g.w, release, nil
		default:
			leave()
			return watches{}, nil, fmt.Errorf("%w: held or awaited through this same session", ErrLocked)
		}
	}
	select {
	case g.ch <- struct{}{}:
		return g.w, release, nil
	case <-ctx.Done():
		leave()
		return watches{}, nil, ctx.Err()
	case <-s.ctx.Done():
		leave()
		return watches{}, nil, context.Cause(s.ctx)
	}
}
