package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdtest"
	"github.com/leasefence/leasefence/lease"
)

// FuzzLockStateMachine drives one lock name through a random sequence of
// operations from three sessions, against the shared etcd, and checks the
// library against a model after every step: who holds the lock, what etcd's
// queue holds, how each ending shows, and that tokens only grow.
func FuzzLockStateMachine(f *testing.F) {
	f.Add([]byte{0, 10, 1, 11, 2, 20, 0, 30, 1, 40, 0})
	f.Add([]byte{0, 0, 1, 50, 0, 60, 2, 2, 10, 11, 12})
	f.Add([]byte{1, 20, 1, 31, 41, 2, 52, 0, 62, 12})
	f.Fuzz(func(t *testing.T, script []byte) {
		if len(script) > 24 {
			script = script[:24] // each step is a few etcd round trips
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cli := etcd.Client(t)
		name := etcdtest.Name(t, "fsm")

		sessions := make([]*lease.Session, 3)
		open := func(i int) {
			s, err := lease.NewSession(ctx, cli, lease.WithTTL(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			sessions[i] = s
		}
		for i := range sessions {
			open(i)
		}
		defer func() {
			for _, s := range sessions {
				s.Close()
			}
		}()
		// The model: which session holds the lock, with which Lock.
		holderIdx, lastToken := -1, int64(0)
		var holder *lease.Lock
		ended := func(want error) {
			t.Helper()
			select {
			case <-holder.Done():
			case <-time.After(3 * time.Second):
				t.Fatalf("lock not ended 3s after %v", want)
			}
			if !errors.Is(holder.Err(), want) {
				t.Fatalf("Err() = %v, want %v", holder.Err(), want)
			}
			holder, holderIdx = nil, -1
		}
		for step, b := range script {
			i := int(b % 3)
			switch op := b / 10 % 7; op {
			case 0, 1: // TryLock by session i
				l, err := sessions[i].TryLock(ctx, name)
				switch {
				case holder == nil && err != nil:
					t.Fatalf("step %d: TryLock on a free lock: %v", step, err)
				case holder != nil && !errors.Is(err, lease.ErrLocked):
					t.Fatalf("step %d: TryLock while session %d holds: %v, want ErrLocked", step, holderIdx, err)
				case err == nil:
					if l.Token() <= lastToken {
						t.Fatalf("step %d: token %d not above %d", step, l.Token(), lastToken)
					}
					holder, holderIdx, lastToken = l, i, l.Token()
				}
			case 2: // the holder unlocks
				if holder != nil {
					if err := holder.Unlock(ctx); err != nil {
						t.Fatalf("step %d: Unlock: %v", step, err)
					}
					ended(lease.ErrUnlocked)
				}
			case 3: // session i's lease is revoked under it
				if _, err := cli.Revoke(ctx, sessions[i].Lease()); err != nil {
					t.Fatal(err)
				}
				if holderIdx == i {
					ended(lease.ErrLost)
				}
				sessions[i].Close() // the session itself notices at its next keep-alive
				open(i)
			case 4: // an operator deletes the holder's key
				if holder != nil {
					if _, err := cli.Delete(ctx, holder.Key()); err != nil {
						t.Fatal(err)
					}
					ended(lease.ErrKeyDeleted)
				}
			case 5: // session i closes
				sessions[i].Close()
				if holderIdx == i {
					ended(lease.ErrSessionClosed)
				}
				open(i)
			case 6: // a stale Unlock of an ended lock changes nothing
				if holder == nil {
					continue
				}
				l := holder
				if err := l.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
				ended(lease.ErrUnlocked)
				if err := l.Unlock(ctx); !errors.Is(err, lease.ErrUnlocked) {
					t.Fatalf("step %d: second Unlock: %v", step, err)
				}
			}
			// etcd's queue matches the model.
			resp, err := cli.Get(ctx, name+"/", clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case holder == nil && len(resp.Kvs) != 0:
				t.Fatalf("step %d: no holder in the model, etcd has %d keys", step, len(resp.Kvs))
			case holder != nil && (len(resp.Kvs) != 1 || string(resp.Kvs[0].Key) != holder.Key() || resp.Kvs[0].CreateRevision != holder.Token()):
				t.Fatalf("step %d: holder %s@%d, etcd has %v", step, holder.Key(), holder.Token(), resp.Kvs)
			}
			if holder != nil && holder.Err() != nil {
				t.Fatalf("step %d: the holder's lock ended: %v", step, holder.Err())
			}
		}
	})
}
