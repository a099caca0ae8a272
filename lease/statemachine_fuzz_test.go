package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// FuzzLockStateMachine drives one lock name through a random sequence of
// operations from three sessions, writers and readers, against the shared etcd, and checks the
// library against a model after every step: who holds the lock, what etcd's
// queue holds, how each ending shows, and that tokens only grow.
func FuzzLockStateMachine(f *testing.F) {
	f.Add([]byte{0, 10, 1, 11, 2, 20, 0, 30, 1, 40, 0})
	f.Add([]byte{0, 0, 1, 50, 0, 60, 2, 2, 10, 11, 12})
	f.Add([]byte{1, 20, 1, 31, 41, 2, 52, 0, 62, 12})
	f.Add([]byte{10, 11, 12, 0, 20, 21, 1, 22, 10, 40, 11, 51, 12, 60, 2})
	f.Fuzz(func(t *testing.T, script []byte) {
		if len(script) > 24 {
			script = script[:24] // each step is a few etcd round trips
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cli := etcd.Client(t)
		name := etcdproc.Name(t, "fsm")

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
		// The model: each session's holding of the name, if any (readers
		// share it; a writer holds it alone), and the last token granted.
		var holds [3]*lease.Lock
		lastToken := int64(0)
		pick := func(i int) int { // session i's holding, or else the first one
			if holds[i] != nil {
				return i
			}
			for j, h := range holds {
				if h != nil {
					return j
				}
			}
			return -1
		}
		held := func() (n int, writer bool) {
			for _, h := range holds {
				if h != nil {
					n++
					writer = writer || h.Mode() == lease.Write
				}
			}
			return n, writer
		}
		ended := func(j int, want error) {
			t.Helper()
			h := holds[j]
			select {
			case <-h.Done():
			case <-time.After(3 * time.Second):
				t.Fatalf("lock not ended 3s after %v", want)
			}
			if !errors.Is(h.Err(), want) {
				t.Fatalf("Err() = %v, want %v", h.Err(), want)
			}
			holds[j] = nil
		}
		for step, b := range script {
			i := int(b % 3)
			n, writer := held()
			switch op := b / 10 % 7; op {
			case 0, 1: // TryLock (0) or TryRLock (1) by session i
				take, mode := sessions[i].TryLock, lease.Write
				if op == 1 {
					take, mode = sessions[i].TryRLock, lease.Read
				}
				free := holds[i] == nil && (n == 0 || (mode == lease.Read && !writer))
				l, err := take(ctx, name)
				switch {
				case free && err != nil:
					t.Fatalf("step %d: Try %v on a lock free for it: %v", step, mode, err)
				case !free && !errors.Is(err, lease.ErrLocked):
					t.Fatalf("step %d: Try %v while held (%d holdings, writer %v): %v, want ErrLocked", step, mode, n, writer, err)
				case err == nil:
					if l.Token() <= lastToken || l.Mode() != mode {
						t.Fatalf("step %d: token %d (last %d), mode %v (want %v)", step, l.Token(), lastToken, l.Mode(), mode)
					}
					holds[i], lastToken = l, l.Token()
				}
			case 2: // a holder unlocks
				if j := pick(i); j >= 0 {
					if err := holds[j].Unlock(ctx); err != nil {
						t.Fatalf("step %d: Unlock: %v", step, err)
					}
					ended(j, lease.ErrUnlocked)
				}
			case 3: // session i's lease is revoked under it
				if _, err := cli.Revoke(ctx, sessions[i].Lease()); err != nil {
					t.Fatal(err)
				}
				if holds[i] != nil {
					ended(i, lease.ErrLost)
				}
				sessions[i].Close() // the session itself notices at its next keep-alive
				open(i)
			case 4: // an operator deletes a holder's key
				if j := pick(i); j >= 0 {
					if _, err := cli.Delete(ctx, holds[j].Key()); err != nil {
						t.Fatal(err)
					}
					ended(j, lease.ErrKeyDeleted)
				}
			case 5: // session i closes
				sessions[i].Close()
				if holds[i] != nil {
					ended(i, lease.ErrSessionClosed)
				}
				open(i)
			case 6: // a stale Unlock of an ended lock changes nothing
				j := pick(i)
				if j < 0 {
					continue
				}
				l := holds[j]
				if err := l.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
				ended(j, lease.ErrUnlocked)
				if err := l.Unlock(ctx); !errors.Is(err, lease.ErrUnlocked) {
					t.Fatalf("step %d: second Unlock: %v", step, err)
				}
			}
			// etcd's queue matches the model: the holdings' keys, tokens and
			// modes, and nothing else.
			resp, err := cli.Get(ctx, name+"/", clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]*lease.Lock{}
			for _, h := range holds {
				if h != nil {
					want[h.Key()] = h
					if h.Err() != nil {
						t.Fatalf("step %d: a holding in the model ended: %v", step, h.Err())
					}
				}
			}
			if len(resp.Kvs) != len(want) {
				t.Fatalf("step %d: the model has %d holdings, etcd %d keys", step, len(want), len(resp.Kvs))
			}
			for _, kv := range resp.Kvs {
				h := want[string(kv.Key)]
				if h == nil || kv.CreateRevision != h.Token() || (string(kv.Value) == lease.ReaderValue) != (h.Mode() == lease.Read) {
					t.Fatalf("step %d: etcd has %s@%d %q, not in the model", step, kv.Key, kv.CreateRevision, kv.Value)
				}
			}
		}
	})
}
