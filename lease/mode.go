package lease

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Mode is how a holding shares its name: exclusively (Write, by Lock,
// TryLock and Campaign) or with other readers (Read, by RLock and
// TryRLock).
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

// ReaderValue is the value of a read holding's key. Every other queue key
// (this package's Lock and Campaign, etcd's Mutex, Election, Lock RPC and
// etcdctl lock) counts as a writer: etcd's own lock code, which knows
// nothing of readers, waits behind readers like behind anyone, and readers
// wait behind it.
const ReaderValue = "leasefence:read"

// modeOf is the mode of the holding whose queue key kv is.
func modeOf(kv *mvccpb.KeyValue) Mode {
	if string(kv.Value) == ReaderValue {
		return Read
	}
	return Write
}

// RLock takes name for reading, waiting until no writer is ahead of it in
// the queue or ctx ends. Readers share: every reader queued before the
// first waiting writer holds at once. A writer is exclusive, and the queue
// is first in, first out by creation revision, so a reader that queues
// behind a waiting writer waits for that writer (writers never starve).
//
// The Lock it returns works as any other: Token (its key's creation
// revision), Done, Err, Context, a guarded Unlock, fence.Held. A writer's
// token is larger than the token of every reader it followed, so a
// resource fenced with writers' tokens refuses anything from an earlier
// holding. Locks of one name through one session, read or write, take
// turns (they share one key); use one session per concurrent reader.
//
// On failure the waiter's key is removed, as for Lock; a reader whose own
// key or session vanishes while it waits returns at once with that loss,
// never with a grant.
func (s *Session) RLock(ctx context.Context, name string) (*Lock, error) {
	l, err := s.acquire(ctx, name, Read, "", false)
	if err != nil {
		return nil, failed(fmt.Sprintf("rlock %q", name), err)
	}
	return l, nil
}

// TryRLock takes name for reading if no writer holds it or waits for it,
// and returns an error wrapping ErrLocked at once otherwise, naming the
// writer's key and token. When one of the 16 oldest keys of the queue is a
// writer's it writes nothing; when the first writer lies further back, it
// finds out after queueing and removes its key before returning.
func (s *Session) TryRLock(ctx context.Context, name string) (*Lock, error) {
	l, err := s.acquire(ctx, name, Read, "", true)
	if err != nil {
		return nil, failed(fmt.Sprintf("tryrlock %q", name), err)
	}
	return l, nil
}

// Mode is Read for a holding taken by RLock or TryRLock, Write otherwise.
func (l *Lock) Mode() Mode { return l.mode }

// blocks tells whether the queue key kv, older than the lock's own, keeps
// the lock from being held: any key blocks a writer; only writers block a
// reader.
func (l *Lock) blocks(kv *mvccpb.KeyValue) bool {
	return l.mode == Write || modeOf(kv) == Write
}
