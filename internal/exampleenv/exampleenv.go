// Package exampleenv gives the runnable examples an etcd client: to the
// endpoints given with -endpoints or ETCD_ENDPOINTS, or else to an embedded
// etcd started for the run, and says which.
package exampleenv

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdtest"
)

// Connect returns a client and a function that closes it (and stops the
// embedded etcd, if one was started). endpoints is a comma-separated list;
// empty means ETCD_ENDPOINTS, and if that is empty too, an embedded etcd.
func Connect(ctx context.Context, endpoints string, out io.Writer) (*clientv3.Client, func(), error) {
	var eps []string
	for _, e := range strings.Split(endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		eps, _ = etcdtest.External()
	}
	stop := func() {}
	if len(eps) == 0 {
		start := time.Now()
		c, err := etcdtest.Start(ctx, etcdtest.Config{})
		if err != nil {
			return nil, nil, err
		}
		fmt.Fprintf(out, "no -endpoints or %s given: started an embedded etcd at %s in %v\n",
			etcdtest.EnvEndpoints, c.Endpoints()[0], time.Since(start).Round(time.Millisecond))
		eps, stop = c.Endpoints(), c.Close
	} else {
		fmt.Fprintf(out, "using etcd at %s\n", strings.Join(eps, ","))
	}
	cli, err := etcdtest.NewClient(eps)
	if err != nil {
		stop()
		return nil, nil, err
	}
	return cli, func() { cli.Close(); stop() }, nil
}

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
