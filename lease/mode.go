package lease

import (
	"context"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/leasefence/leasefence/internal/queuekey"
)

// Mode is how a holding shares its name: Write (Lock, TryLock, Campaign)
// or Read (RLock, TryRLock).
type Mode int

const (
	// Write excludes every other holding of the name, read or write.
	Write Mode = iota
	// Read shares the name with other Read holdings, and excludes Write.
	Read
)

// String is "write" or "read".
func (m Mode) String() string {
	if m == Read {
		return "read"
	}
	return "write"
}

// ReaderValue is the value of a read holding's key. Any other queue key
// is a writer's, etcd's own lock and election keys included: etcd's lock
// code knows nothing of readers and waits behind them as behind anyone.
const ReaderValue = queuekey.ReaderValue

func modeOf(kv *mvccpb.KeyValue) Mode {
	if queuekey.IsReader(kv) {
		return Read
	}
	return Write
}

// RLock takes name for reading, waiting until no writer is ahead of it in
// the queue or ctx ends. Readers queued before the first waiting writer
// hold at once; a reader queued behind a waiting writer waits for it, so
// writers never starve. A writer's token is larger than that of every
// reader it followed. Locks of one name through one session, read or
// write, take turns: use one session per concurrent reader. Failure is as
// for Lock: the key is removed, and a lost key or session is never a grant.
func (s *Session) RLock(ctx context.Context, name string) (*Lock, error) {
	return s.acquire(ctx, Call{Op: "RLock", Name: name, Mode: Read}, "", false, nil)
}

// TryRLock takes name for reading if no writer holds it or waits for it,
// else returns at once an error wrapping ErrLocked that names the writer.
// A failed TryRLock leaves no key behind. It writes nothing when the writer
// is near the head of the queue; behind many keys it may put its key and
// remove it again.
func (s *Session) TryRLock(ctx context.Context, name string) (*Lock, error) {
	return s.acquire(ctx, Call{Op: "TryRLock", Name: name, Mode: Read}, "", true, nil)
}

// blocksKV tells whether kv, a key under the name older than the lock's
// own, is a queue key that blocks it (queuekey.Blocks): any queue key
// blocks a writer, only a writer's a reader. A key that is not a queue key
// (data, a nested lock's key, a key moved off its lease) is no lock and
// never blocks.
func (t *tracker) blocksKV(kv *mvccpb.KeyValue) bool {
	return queuekey.Blocks(t.prefix(), t.mode == Read, kv)
}
