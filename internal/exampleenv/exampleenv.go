// Package exampleenv is what the runnable examples and the tests that
// re-run their own binary share: child processes that can really be
// stopped and killed, and a timeline of what happened when. It needs only
// etcd's client; examples/internal/exampleetcd starts an embedded etcd.
package exampleenv

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Timeline prints events with the time since it started, one per line, and
// is safe for concurrent use.
type Timeline struct {
	mu    sync.Mutex
	out   io.Writer
	start time.Time
}

// NewTimeline starts a timeline now.
func NewTimeline(out io.Writer) *Timeline { return &Timeline{out: out, start: time.Now()} }

// Printf prints one event by who.
func (t *Timeline) Printf(who, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.out, "%7.3fs  %-8s %s\n", time.Since(t.start).Seconds(), who, fmt.Sprintf(format, args...))
}

// AwaitDelete waits for the delete event on a watch.
func AwaitDelete(wch clientv3.WatchChan) error {
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return err
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return nil
			}
		}
	}
	return errors.New("watch ended before the key was deleted")
}

// Cleanup is a list of things to undo, run last first, as deferred calls
// would: for examples whose phases each set something up.
type Cleanup []func()

// Add schedules f.
func (c *Cleanup) Add(f func()) { *c = append(*c, f) }

// Run undoes everything added, last first, and forgets it.
func (c *Cleanup) Run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
	*c = nil
}
