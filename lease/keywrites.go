package lease

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/lease/internal/keywrite"
)

// The writes of a lock key that a late copy could turn against another
// holding (the puts, the withdrawal of an unanswered put, the removal of
// a key the session's own late put left) are lease/internal/keywrite's,
// guarded by a marker per lock key; writes.go lists every write with its
// guard.

// markerKey is the marker of the session's lock key for name: under the
// library's own prefix, outside every queue, on the session's lease.
func markerKey(name string, id clientv3.LeaseID) string {
	return fmt.Sprintf("%s%s/%x", markerPrefix, name, int64(id))
}

// keyWriting is the tuning and the error every session's key writes share.
var keyWriting = keywrite.Config{Refusals: withdrawRefusals, InUse: ErrKeyInUse}

// keyWrites are the marker-guarded writes of the session's key for name.
func (s *Session) keyWrites(name, key string) keywrite.Writes {
	return keywrite.New((*keySession)(s), &keyWriting, name, key)
}

// keySession is a session as its lock keys' writes see it
// (keywrite.Session).
type keySession Session

func (k *keySession) Keys() clientv3.KV         { return k.keys }
func (k *keySession) Lease() clientv3.LeaseID   { return k.id }
func (k *keySession) Markers() *keywrite.Book   { return &k.markers }
func (k *keySession) Marker(name string) string { return markerKey(name, k.id) }
func (k *keySession) Ctx() context.Context      { return k.ctx }
func (k *keySession) Log() *zap.Logger          { return k.lg }
func (k *keySession) Seam() keywrite.Seam       { return k.writes }
