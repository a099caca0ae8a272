//go:build !leasefence_mutants

package lease

import (
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// The plain forms of the checks the fault suite replaces with deliberate
// bugs under the build tag leasefence_mutants (ownership_mutants.go).

// faultSeam is empty in release builds.
type faultSeam struct{}

// owns tells whether kv, a read or a watch event of the lock's key, is
// still this holding: created with the token, attached to the session's
// lease, and of the lock's mode (a writer's key that someone's put made a
// reader's lets readers in: it is no longer this writer's holding). A
// deleted key (nil, or a delete event's bare key) is not.
func (t *tracker) owns(kv *mvccpb.KeyValue) bool {
	return kv != nil && kv.CreateRevision == t.token && kv.Lease == int64(t.s.id) && modeOf(kv) == t.mode
}

// grantedTTL is the TTL etcd granted, never the one asked for.
func (o *options) grantedTTL(seconds int64) time.Duration {
	return time.Duration(seconds) * time.Second
}

// renewedTTL is the TTL a keep-alive answer reports, in seconds.
func (s *Session) renewedTTL(seconds int64) time.Duration {
	return time.Duration(seconds) * time.Second
}
