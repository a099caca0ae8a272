package etcdtest

import (
	"errors"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

// HoldApply keeps the member from applying committed entries to its store
// until release is called (release may be called more than once), and
// returns release. The member stays in raft all the while: it appends,
// acknowledges and votes, and gets read indexes from the leader. Only its
// store stands still, at the revision it had reached. A serializable read
// it answers meanwhile shows that revision, older than what the others
// have committed, and a linearizable read waits for release: a lagging
// member (one with a slow disk, or a stalled apply), for exactly as long
// as a test wants one.
//
// A peer proxy cannot make one follower lag like that: the follower still
// hears the leader over the connections it dialed to the other members'
// peer ports, which their proxies share with the traffic the others need
// between themselves.
//
// It takes the lock of the store's write transaction (which etcd's
// backend lets tests take), which applying a write needs and no read
// does. Call release before the member or cluster is stopped: a stopping
// member waits for the apply under way.
func (m *Member) HoldApply() (release func(), err error) {
	e := m.Server()
	if e == nil {
		return nil, errors.New("etcdtest: HoldApply on a stopped member")
	}
	tx := e.Server.Backend().BatchTx()
	tx.Lock()
	return sync.OnceFunc(tx.Unlock), nil
}

// LeakCheckStoppedMembers is LeakCheck for a test that starts a cluster of
// its own with more than one member: the peer connections its members
// leave behind once stopped (see Env.IgnoreStoppedMembers) are etcd's and
// are not counted. Its package's Env sets IgnoreStoppedMembers too, for
// the check at the end of the run.
func LeakCheckStoppedMembers(tb testing.TB) {
	tb.Helper()
	opts := append(etcdServerLeaks(), stoppedMemberLeaks()...)
	opts = append(opts, goleak.IgnoreCurrent())
	tb.Cleanup(func() {
		if err := goleak.Find(opts...); err != nil {
			tb.Errorf("goroutines leaked: %v", err)
		}
	})
}

// stoppedMemberLeaks are the goroutines of the HTTP connections between
// embedded members' peer ports that stay open once the members have
// stopped: etcd closes neither the client ends in its transports nor the
// server ends it accepted, and both are in this process.
func stoppedMemberLeaks() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
	}
}
