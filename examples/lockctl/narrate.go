package main

import (
	"context"
	"fmt"
	"io"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/lease"
)

// narrator prints run's progress on stderr while it waits for the lock:
// one line when it starts waiting behind a holder (who, with the owner
// and token), one per lost holding whose lock delay it waits out, and
// with -v the grant; nothing with -q. The session's hooks only hand it
// events, as hooks must be quick and never call back into the session;
// its own goroutine reads the queue and prints.
type narrator struct {
	cli   *clientv3.Client
	r     runFlags
	w     io.Writer
	start time.Time
	evs   chan event
	lease chan clientv3.LeaseID // the session's lease, once opened

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// event is what a hook saw: waiting began, or a delay after lost.
type event struct {
	delay bool
	lost  int64
	left  time.Duration
}

// newNarrator starts a narrator; stop ends it.
func newNarrator(cli *clientv3.Client, r runFlags, w io.Writer) *narrator {
	ctx, cancel := context.WithCancel(context.Background())
	n := &narrator{cli: cli, r: r, w: w, start: time.Now(), evs: make(chan event, 8),
		lease: make(chan clientv3.LeaseID, 1), ctx: ctx, cancel: cancel, done: make(chan struct{})}
	go n.loop()
	return n
}

// hooks are the session's hooks that feed the narrator.
func (n *narrator) hooks() *lease.Hooks {
	return &lease.Hooks{
		Waiting: func(_ string, delta int) {
			if delta > 0 {
				n.send(event{})
			}
		},
		Delaying: func(_ string, lost int64, left time.Duration) { n.send(event{delay: true, lost: lost, left: left}) },
	}
}

// opened tells the narrator the session's lease, to find its own place.
func (n *narrator) opened(id clientv3.LeaseID) {
	select {
	case n.lease <- id:
	default:
	}
}

func (n *narrator) send(e event) {
	select {
	case n.evs <- e:
	default: // a line lost is better than a hook that blocks
	}
}

// stop ends the narrator once it has printed what it was handed.
func (n *narrator) stop() {
	n.cancel()
	<-n.done
}

func (n *narrator) loop() {
	defer close(n.done)
	var id clientv3.LeaseID
	for {
		select {
		case id = <-n.lease:
		case e := <-n.evs:
			n.tell(e, id)
		case <-n.ctx.Done():
			for {
				select {
				case e := <-n.evs:
					n.tell(e, id)
				default:
					return
				}
			}
		}
	}
}

// tell prints the line for e.
func (n *narrator) tell(e event, id clientv3.LeaseID) {
	if n.r.quiet {
		return
	}
	if e.delay {
		fmt.Fprintf(n.w, "lockctl: run %s: the holder with token %d lost the lock; waiting out the lock delay, about %v left, so that its command is stopped first\n",
			n.r.name, e.lost, e.left)
		return
	}
	fmt.Fprintf(n.w, "lockctl: run %s: %s\n", n.r.name, n.behind(id))
}

// behind says whom run waits behind, from a read of the queue.
func (n *narrator) behind(id clientv3.LeaseID) string {
	// Not n.ctx: a line handed over before stop still gets its read.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	q, err := lease.Inspect(ctx, n.cli, n.r.name)
	if err != nil {
		return fmt.Sprintf("waiting for the lock (its queue could not be read: %v)", err)
	}
	ahead := len(q)
	for i, e := range q {
		if e.Lease == id {
			ahead = i
		}
	}
	if ahead == 0 || len(q) == 0 {
		return "waiting for the lock"
	}
	h := q[0]
	return fmt.Sprintf("waiting behind %s (owner %s, token %d), %d ahead", h.Key, ownerCell(h.Owner), h.Token, ahead)
}

// granted prints the grant with -v.
func (n *narrator) granted(l *lease.Lock) {
	if n.r.verbose {
		fmt.Fprintf(n.w, "lockctl: run %s: granted, token %d, after %v\n", n.r.name, l.Token(), time.Since(n.start).Round(time.Millisecond))
	}
}
