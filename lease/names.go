package lease

import (
	"fmt"
	"strings"
	"unicode"

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

// isQueueKey tells whether key belongs to the queue of the lock whose prefix
// is pfx (name + "/"), and not to a nested lock such as name/sub.
func isQueueKey(pfx string, key []byte) bool {
	rest, ok := strings.CutPrefix(string(key), pfx)
	return ok && rest != "" && !strings.Contains(rest, "/")
}
