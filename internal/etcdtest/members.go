package etcdtest

import (
	"errors"
	"sync"
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
