package fence

import (
	"strings"

	"github.com/leasefence/leasefence/internal/etcdcompat"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// heldKey is a Holder with a fixed key and token: a snapshot of a holding
// made by code other than package lease.
type heldKey struct {
	name, key string
	token     int64
}

func (h heldKey) Name() string { return h.name }
func (h heldKey) Key() string  { return h.key }
func (h heldKey) Token() int64 { return h.token }

// FromMutex returns a Holder for a *concurrency.Mutex of etcd's client,
// for services that lock with it and want their writes fenced. Call it
// after a successful Lock or TryLock: it keeps the mutex's key and its
// creation revision (read from the mutex's own ownership comparison,
// IsOwner), so the Holder stays valid after the mutex forgets them on
// Unlock. A guard built from it holds while that key exists with that
// revision: Held fails with ErrNotHeld once the mutex is unlocked or its
// session lost. Called before the mutex holds the lock, it gives a Holder
// that every guard refuses as invalid.
//
// What such a holder does not get, compared with *lease.Lock: no loss
// signal (Err, Done) and so no check before sending; Unlock deletes the key
// by name; each contended handoff waits up to 100 ms for etcd's watch
// catch-up; a waiter whose key vanishes keeps waiting. Moving to package
// lease is a change of constructor: lease.NewSession and Session.Lock use
// the same key layout and exclude, and are excluded by, the Mutex.
//
// Never use Mutex.Header().Revision as a token: after a contended wait it
// is a later revision than the key's creation.
func FromMutex(m *concurrency.Mutex) Holder {
	owner := m.IsOwner()
	return snapshot(m.Key(), etcdcompat.Compare(owner).GetCreateRevision())
}

// FromElection returns a Holder for a *concurrency.Election that has won a
// Campaign, with the leader key's creation revision (Election.Rev) as the
// token, on the same terms as FromMutex.
func FromElection(e *concurrency.Election) Holder {
	return snapshot(e.Key(), e.Rev())
}

// snapshot is the Holder of key with token; the name is the key's prefix,
// as etcd's layout makes it.
func snapshot(key string, token int64) Holder {
	name := key
	if i := strings.LastIndex(key, "/"); i >= 0 {
		name = key[:i]
	}
	return heldKey{name: name, key: key, token: token}
}
