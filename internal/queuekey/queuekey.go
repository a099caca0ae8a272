// Package queuekey says which etcd keys are places in a lock's queue, and
// which of them keep a holding from its name: the one rule that package
// lease grants by and that fencestore's verifier checks a token against,
// so that the two cannot drift apart.
package queuekey

import (
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// ReaderValue is the value of a read holding's key. Any other queue key is
// a writer's, etcd's own lock and election keys included: etcd's lock code
// knows nothing of readers and waits behind them as behind anyone.
const ReaderValue = "leasefence:read"

// IsChild tells whether kv lies directly under pfx (a name and "/"): a key
// that may be a queue key, as far as a keys-only read tells.
func IsChild(pfx string, kv *mvccpb.KeyValue) bool {
	rest, ok := strings.CutPrefix(string(kv.Key), pfx)
	return ok && rest != "" && !strings.Contains(rest, "/")
}

// IsQueueKey tells whether kv is a place in the queue under pfx: directly
// under it and named after its lease in lowercase hex, as etcd's own lock
// code writes. A key with no lease, or moved by someone's put onto another
// lease, is no place in any queue. kv must come from a read that fills
// Lease: etcd 3.7 leaves it empty in keys-only reads.
func IsQueueKey(pfx string, kv *mvccpb.KeyValue) bool {
	if !IsChild(pfx, kv) || kv.Lease == 0 {
		return false
	}
	return strings.TrimPrefix(string(kv.Key), pfx) == strconv.FormatInt(kv.Lease, 16)
}

// IsReader tells a read holding's key.
func IsReader(kv *mvccpb.KeyValue) bool { return string(kv.Value) == ReaderValue }

// Blocks tells whether kv, a key under pfx older than a holding's own key,
// keeps that holding from the name: a queue key blocks a writer, and only a
// writer's queue key blocks a reader (reader set). A holding is granted
// once no key older than its own blocks it. No key is ever created older
// than one that exists, so no new key can block a holding later; but a put
// on an older key can change what it blocks (its value, read or not, or
// its lease), and each reader of the rule decides on what it read.
func Blocks(pfx string, reader bool, kv *mvccpb.KeyValue) bool {
	return IsQueueKey(pfx, kv) && (!reader || !IsReader(kv))
}
