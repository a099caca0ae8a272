package lease

import (
	"fmt"
	"strings"
	"unicode"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/queuekey"
)

// validateName checks a lock name. A name ending in "/" would make its keys
// look like a nested lock's; "a//b" cannot be told from "a/b" in a
// path-like layout; control characters break logs, etcdctl and the HTTP
// headers that carry names.
func validateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty lock name", ErrInvalidArgument)
	case strings.HasSuffix(name, "/"):
		return fmt.Errorf("%w: lock name %q ends in /", ErrInvalidArgument, name)
	case strings.Contains(name, "//"):
		return fmt.Errorf("%w: lock name %q has an empty segment", ErrInvalidArgument, name)
	case strings.IndexFunc(name, unicode.IsControl) >= 0:
		return fmt.Errorf("%w: lock name %q has a control character", ErrInvalidArgument, name)
	}
	return nil
}

// lockKey is a session's key for a lock, in etcd's own layout.
func lockKey(name string, id clientv3.LeaseID) string {
	return fmt.Sprintf("%s/%x", name, int64(id))
}

// ownKeyPrefix starts every key the library writes that is not a place in
// a queue (a marker, a lock-delay record). No lock name may start with a
// control character, so no name's queue, nested or not, ours or etcd's
// Mutex's and Election's, ever holds one of these keys.
const ownKeyPrefix = "\x01leasefence/"

// The library's own keys by kind, each followed by the lock name.
const (
	markerPrefix = ownKeyPrefix + "marker/"
	delayPrefix  = ownKeyPrefix + "lock-delay/"
)

// OwnPrefixes are the key prefixes, besides namePrefix itself, that the
// library writes for lock names starting with namePrefix. An etcd role
// that may use those names needs read and write permission on namePrefix
// and on each of these (docs/operations.md has the recipe); a role of
// another prefix sees none of them.
func OwnPrefixes(namePrefix string) []string {
	return []string{markerPrefix + namePrefix, delayPrefix + namePrefix}
}

// QueueName tells whether a key attached to lease leaseID is a place in a
// lock's or an election's queue (name, "/", the lease ID in lowercase
// hex), and if so the name. It sends nothing.
func QueueName(key []byte, leaseID clientv3.LeaseID) (name string, ok bool) {
	i := strings.LastIndexByte(string(key), '/')
	if i <= 0 {
		return "", false
	}
	name = string(key[:i])
	if validateName(name) != nil {
		return "", false // a key of the library's own (ownKeyPrefix), say
	}
	return name, isQueueKey(name+"/", &mvccpb.KeyValue{Key: key, Lease: int64(leaseID)})
}

// isQueueKey is queuekey.IsQueueKey: the rule fencestore verifies by too.
func isQueueKey(pfx string, kv *mvccpb.KeyValue) bool { return queuekey.IsQueueKey(pfx, kv) }

// isReader tells a reader's key.
func isReader(kv *mvccpb.KeyValue) bool { return modeOf(kv) == Read }

// prefix is the lock's name and a slash: the start of its key, shared
// with it rather than made for each lock.
func (t *tracker) prefix() string { return t.key[:len(t.name())+1] }

// isQueueKey and isChild are isQueueKey and isChildKey for the lock's
// name.
func (t *tracker) isQueueKey(kv *mvccpb.KeyValue) bool { return isQueueKey(t.prefix(), kv) }
func (t *tracker) isChild(kv *mvccpb.KeyValue) bool    { return isChildKey(t.prefix(), kv) }

// isChildKey is queuekey.IsChild.
func isChildKey(pfx string, kv *mvccpb.KeyValue) bool { return queuekey.IsChild(pfx, kv) }
