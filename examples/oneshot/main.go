// Command oneshot is a one-shot job written for lockctl run: it commits
// one fenced write with the token run hands it, and exits.
//
//	lockctl run -record jobs/nightly/fence jobs/nightly -- \
//	    oneshot jobs/nightly/last-run "$(date -u +%FT%TZ)"
//
// It reads LEASEFENCE_TOKEN (the lock's fencing token), LEASEFENCE_RECORD
// (the fence record, from run's -record) and LEASEFENCE_ENDPOINTS, all set
// by lockctl run, and writes KEY=VALUE in one etcd transaction with the
// fence check: the write lands only if no holder with a later token has
// written through the same record, and the record is raised to this
// token in the same step. So a run that lost the lock while it worked
// (paused, cut off, slow) cannot overwrite what the next run wrote, even
// if it reaches etcd late.
//
// Exit status: 0 written; 3 refused, a later holder has written (nothing
// changed); 4 no answer, the write may have landed (read KEY back before
// trying again); 2 bad arguments or environment; 1 anything else.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
)

const (
	exitFailed  = 1
	exitUsage   = 2
	exitStale   = 3
	exitUnknown = 4
)

func main() {
	code, err := run(os.Args[1:], os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "oneshot:", err)
	}
	os.Exit(code)
}

// job is what one run writes, and under which token.
type job struct {
	endpoints []string
	record    string
	token     int64
	key       string
	value     string
}

// parse reads the job from the arguments and lockctl run's environment.
func parse(args []string, getenv func(string) string) (job, error) {
	if len(args) != 2 {
		return job{}, errors.New("usage: oneshot KEY VALUE (under lockctl run -record RECORD NAME --)")
	}
	j := job{key: args[0], value: args[1], record: getenv("LEASEFENCE_RECORD")}
	for _, e := range strings.Split(getenv("LEASEFENCE_ENDPOINTS"), ",") {
		if e = strings.TrimSpace(e); e != "" {
			j.endpoints = append(j.endpoints, e)
		}
	}
	token, err := strconv.ParseInt(getenv("LEASEFENCE_TOKEN"), 10, 64)
	switch {
	case err != nil || token <= 0:
		return job{}, fmt.Errorf("LEASEFENCE_TOKEN %q: want the token lockctl run sets", getenv("LEASEFENCE_TOKEN"))
	case j.record == "":
		return job{}, errors.New("LEASEFENCE_RECORD is empty: run under lockctl run -record RECORD")
	case len(j.endpoints) == 0:
		return job{}, errors.New("LEASEFENCE_ENDPOINTS is empty: run under lockctl run")
	case j.key == "" || j.key == j.record:
		return job{}, fmt.Errorf("KEY %q: want a key other than the fence record", j.key)
	}
	j.token = token
	return j, nil
}

// run does the job and returns the exit status.
func run(args []string, getenv func(string) string) (int, error) {
	j, err := parse(args, getenv)
	if err != nil {
		return exitUsage, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: j.endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		return exitFailed, err
	}
	defer cli.Close()
	// The job's own work would go here, before the one write that
	// publishes it. A job that takes long can check the lock is still
	// held by reading its key (LEASEFENCE_KEY), but only the fenced write
	// below is safe against a holder that lost the lock unawares.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = fence.NewTxn(ctx, cli, fence.Resource(j.record, j.token)).
		Then(clientv3.OpPut(j.key, j.value)).
		Commit()
	var stale *fence.StaleError
	switch {
	case err == nil:
		fmt.Printf("wrote %s with token %d\n", j.key, j.token)
		return 0, nil
	case errors.As(err, &stale):
		return exitStale, fmt.Errorf("token %d is stale: %s has accepted %d; %s unchanged", j.token, j.record, stale.Highest, j.key)
	case errors.Is(err, fence.ErrOutcomeUnknown):
		return exitUnknown, fmt.Errorf("%w: read %s back before trying again", err, j.key)
	}
	return exitFailed, err
}
