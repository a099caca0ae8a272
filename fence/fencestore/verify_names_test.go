package fencestore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/leasefence/leasefence/fence/fencestore"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// A name package lease grants but the transports could not carry
// (CheckName: a no-break space, the U+200D of an emoji sequence, more than
// MaxNameLen bytes) is still a name an EtcdStore verifies: a granted
// holding's token is accepted (found by a cold review: the first verifier
// refused every token of such names, even one at the record).
func TestEtcdStoreTakesEveryLeaseName(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	ctx := etcdproc.Ctx(t, 30*time.Second)
	s := newSession(t, cli)
	store, err := fencestore.NewEtcdStore(cli, etcdproc.Name(t, "records")+"/")
	if err != nil {
		t.Fatal(err)
	}
	for _, base := range []string{
		"nightly\u00a0report",
		"team-\U0001F469\u200d\U0001F4BB",
		"long-" + strings.Repeat("x", fencestore.MaxNameLen),
	} {
		name := etcdproc.Name(t, base)
		l, err := s.Lock(ctx, name)
		if err != nil {
			t.Fatalf("lease refused %q: %v", name, err)
		}
		for i := 0; i < 2; i++ {
			if err := store.Accept(ctx, name, l.Token()); err != nil {
				t.Fatalf("granted holding of %q (token %d), request %d: %v", name, l.Token(), i, err)
			}
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// An etcd Mutex waiter that etcd's lock code keeps behind a data key under
// the name (any key under name/ is a waiter to Mutex) is confirmed: by the
// grant rule of package lease, a data key blocks nothing. Nobody holds the
// name then (a queue key ahead would block it), so no holder is fenced out.
func TestMutexWaiterBehindDataKeyConfirmed(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	ctx := etcdproc.Ctx(t, 30*time.Second)
	name := etcdproc.Name(t, "jobs")
	v := verifier(t, cli)
	if _, err := cli.Put(ctx, name+"/checkpoint", "x"); err != nil {
		t.Fatal(err)
	}
	ms, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	m := concurrency.NewMutex(ms, name)
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Lock(lctx) }()
	tok := keyOf(t, cli, name, nil, fmt.Sprintf("%s/%x", name, int64(ms.Lease())))
	err = v.Verify(ctx, name, tok)
	cancel()
	<-done // Lock gives up as lctx ends: it never held
	if err != nil {
		t.Fatalf("the Mutex waiter behind a data key: %v", err)
	}
}
