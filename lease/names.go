package lease

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// validateName checks a lock name before anything is sent. A name ending in
// "/" would make its keys look like those of a nested lock; an empty
// segment ("a//b") makes a name that a path-like layout cannot tell from
// "a/b"; control characters (newline, NUL) break logs, etcdctl and the
// HTTP headers that carry names.
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

// lockKey is the key a session uses for a lock: etcd's own layout, shared
// with concurrency.Mutex, etcd's Lock RPC and etcdctl lock.
func lockKey(name string, id clientv3.LeaseID) string {
	return fmt.Sprintf("%s/%x", name, int64(id))
}

// QueueName tells whether a key attached to lease leaseID is a place in a
// lock's (or election's) queue, and if so the lock's name: the key is the
// name, "/", and the lease ID in lowercase hex, the layout of this package
// and of etcd's own lock and election. Operator tools use it to find the
// locks under a prefix; it reads no value and sends nothing.
func QueueName(key []byte, leaseID clientv3.LeaseID) (name string, ok bool) {
	i := strings.LastIndexByte(string(key), '/')
	if i <= 0 {
		return "", false
	}
	name = string(key[:i])
	return name, isQueueKey(name+"/", &mvccpb.KeyValue{Key: key, Lease: int64(leaseID)})
}

// isQueueKey tells whether kv is a place in the queue of the lock whose
// prefix is pfx (name + "/"): one level under it (not a nested lock's key
// such as name/sub/...), and named after the lease it is attached to, in
// lowercase hex. That is the layout this package, concurrency.Mutex and
// Election, etcd's Lock and Election RPCs and etcdctl lock all write; any
// other key under the name (a user's data key, a key with no lease or a
// lease that does not match its name) is not a place in the queue. kv must
// come from a read that fills Lease: etcd 3.7 leaves it empty in keys-only
// reads.
func isQueueKey(pfx string, kv *mvccpb.KeyValue) bool {
	if !isChildKey(pfx, kv) || kv.Lease == 0 {
		return false
	}
	return strings.TrimPrefix(string(kv.Key), pfx) == strconv.FormatInt(kv.Lease, 16)
}

// isChildKey tells whether kv lies directly under pfx (not under a nested
// name): the keys that may be queue keys, as far as a keys-only read
// tells.
func isChildKey(pfx string, kv *mvccpb.KeyValue) bool {
	rest, ok := strings.CutPrefix(string(kv.Key), pfx)
	return ok && rest != "" && !strings.Contains(rest, "/")
}
