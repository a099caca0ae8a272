package fence

import (
	"fmt"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Holder is a lock holding that can be fenced: the lock's name, its etcd
// key, and its token, the key's creation revision. *lease.Lock and
// *lease.Leadership satisfy it. The guards of this package use the key and
// the token; package fencehttp sends the name and the token.
type Holder interface {
	Name() string
	Key() string
	Token() int64
}

// Ender is a Holder that knows when its holding has ended: Err is nil
// while held and says why after (as *lease.Lock's does). Before sending,
// fenced writes check it, and send nothing for a holder whose Err is set:
// an early warning, never the guarantee.
type Ender interface {
	Err() error
}

// Ended returns the Err of h if h is an Ender, nil otherwise: what a
// fenced write checks before sending.
func Ended(h Holder) error {
	if e, ok := h.(Ender); ok {
		return e.Err()
	}
	return nil
}

// HeldCmps are the comparisons a Held guard makes, for transactions built
// by hand with clientv3's own Txn: they all hold while h's key exists with
// the creation revision h.Token() and is attached to the lease its name
// encodes (the key is name + "/" + the lease ID in lowercase hex, etcd's
// lock layout), and fail, as Held does, for a key that someone else's put
// moved off that lease, onto no lease or another one. Put every one of
// them in the transaction's If:
//
//	cli.Txn(ctx).If(fence.HeldCmps(l)...).Then(ops...)
//
// Unlike a Held guard they do not check the holder's Err before sending,
// and a failure is not an error: the transaction runs its Else. A token
// that is not positive never passes (a missing key has no lease). A key
// that does not end in "/" and the lowercase hex of a positive lease ID
// is no lock key: its comparisons never hold (they require its lease to
// be 0 and not 0), where Held refuses it as bad input. h must not be nil.
func HeldCmps(h Holder) []clientv3.Cmp { return heldCmps(h.Key(), h.Token()) }

// heldCmps is what Held checks of a lock key, for HeldCmps and Txn alike.
// A lock key that someone else's put moved off its lease keeps its
// creation revision, but no longer goes with the holder's session: the
// lease comparison refuses it, whether the put left it with no lease or
// on another live one (which package lease takes for no lock, granting
// the next waiter). For a key that encodes no lease, the comparisons
// contradict each other, so they never hold.
func heldCmps(key string, token int64) []clientv3.Cmp {
	id, ok := KeyLease(key)
	if !ok {
		return []clientv3.Cmp{
			clientv3.Compare(clientv3.LeaseValue(key), "=", 0),
			clientv3.Compare(clientv3.LeaseValue(key), "!=", 0),
		}
	}
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(key), "=", token),
		clientv3.Compare(clientv3.LeaseValue(key), "=", id),
	}
}

// KeyLease is the lease ID a lock key's name encodes: the key's last
// segment, after its last "/", is the ID in lowercase hex with no leading
// zeros, as etcd's lock and election code and package lease write it. ok
// is false for a key with no such segment or an ID that is not positive.
func KeyLease(key string) (id int64, ok bool) {
	i := strings.LastIndexByte(key, '/')
	if i < 0 {
		return 0, false
	}
	seg := key[i+1:]
	id, err := strconv.ParseInt(seg, 16, 64)
	if err != nil || id <= 0 || strconv.FormatInt(id, 16) != seg {
		return 0, false
	}
	return id, true
}

// isLockKey tells whether key is in etcd's lock layout (KeyLease).
func isLockKey(key string) bool {
	_, ok := KeyLease(key)
	return ok
}

type guardKind int

const (
	heldGuard guardKind = iota + 1
	resourceGuard
)

// Guard is a condition a Txn checks in the same etcd transaction as its
// writes. Build one with Held or Resource; the zero Guard is invalid. A Guard
// is a value and may be reused across transactions and goroutines.
type Guard struct {
	kind   guardKind
	key    string
	token  int64
	holder Holder
	rec    *Recorder // set for a Recorder's guards
	claim  bool      // a Claim: the record is set even when nothing else is written
}

// Held is the lock-service check: the lock key still exists with the
// holder's token, attached to the lease its name encodes, so the holder
// has not lost the lock, at the moment etcd applies the transaction. (A
// put by someone else keeps the key's creation revision but moves it off
// that lease: with no lease, as etcdctl put makes, or onto another one.
// Either way package lease takes the key for no lock and may grant the
// next waiter; Held refuses it with ErrNotHeld.) Use it for state kept in
// the same etcd as the lock.
//
// The holder's key must be in etcd's lock layout, name + "/" + the lease
// ID in lowercase hex (as *lease.Lock, FromMutex and FromElection give):
// Commit refuses any other key with ErrInvalidArgument before sending.
// A put on the key made with the holder's own lease ID is not told apart
// from the holder's own.
//
// If the holder also has an Err method (as *lease.Lock does) and it reports
// an error, Commit fails with ErrNotHeld without sending anything.
func Held(h Holder) Guard {
	if h == nil {
		return Guard{kind: heldGuard}
	}
	return Guard{kind: heldGuard, key: h.Key(), token: h.Token(), holder: h}
}

// Resource is the resource-side check: token must be at least the highest
// token recorded at key, a fence record that this package keeps. On success
// the record is set to token in the same transaction (see Txn for when it
// is written); a missing record passes any token and is created. An equal
// token passes (one holder writes many times); a lower one fails with a
// *StaleError and changes nothing. A Recorder's guards leave a record that
// holds their token alone.
//
// Unlike Held, a Resource guard keeps working after the lock is gone and
// for writers that reached the resource by other paths: what it protects
// is the order of tokens, not the lock. Tokens of different lock names are
// unrelated, so a record must only ever see tokens of one lock name.
//
// A record key is never a key attached to a lease, such as a lock key: a
// transaction whose record key has a lease is refused with an error
// wrapping ErrBadRecord, having changed nothing.
func Resource(key string, token int64) Guard {
	return Guard{kind: resourceGuard, key: key, token: token}
}

// Claim is Resource for a holder that is about to read what the record
// fences: the record is set to token in the transaction whatever else it
// does, also when its operations are only reads, so that those reads and
// the claim are one atomic step. From then on no lower token passes the
// record. A record above token refuses the claim with a *StaleError, and
// the reads do not run.
//
// A new holder should claim before its first read of the resource. A plain
// read at the start of a holding is not enough: until the new holder's
// first write raises the record, a write of the previous holder that was
// still in flight can land after the read, and the new holder then builds
// on a state that has changed under it.
func Claim(key string, token int64) Guard {
	return Guard{kind: resourceGuard, key: key, token: token, claim: true}
}

func (g Guard) validate() error {
	switch {
	case g.kind == 0:
		return fmt.Errorf("%w: zero Guard", ErrInvalidArgument)
	case g.kind == heldGuard && g.holder == nil:
		return fmt.Errorf("%w: Held(nil)", ErrInvalidArgument)
	case g.key == "":
		return fmt.Errorf("%w: guard with an empty key", ErrInvalidArgument)
	case g.token <= 0:
		return fmt.Errorf("%w: guard on %q with token %d: tokens are positive", ErrInvalidArgument, g.key, g.token)
	case g.kind == heldGuard && !isLockKey(g.key):
		return fmt.Errorf("%w: Held on %q: a lock key ends in / and its lease ID in lowercase hex", ErrInvalidArgument, g.key)
	}
	return nil
}

// kindName is the guard's kind as WriteGuard names it.
func (g Guard) kindName() string {
	switch {
	case g.kind == heldGuard:
		return "held"
	case g.claim:
		return "claim"
	case g.kind == resourceGuard:
		return "resource"
	}
	return "invalid"
}

// String describes the guard for logs and errors.
func (g Guard) String() string {
	switch g.kind {
	case heldGuard:
		return fmt.Sprintf("held(%s@%d)", g.key, g.token)
	case resourceGuard:
		if g.claim {
			return fmt.Sprintf("claim(%s>=%d)", g.key, g.token)
		}
		return fmt.Sprintf("resource(%s>=%d)", g.key, g.token)
	}
	return "invalid guard"
}
