package fencestore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencestore"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// A client with no etcd access and no holding cannot raise an EtcdStore's
// record above the live holder's token by scanning: it sends a forged
// number, reads etcd's revision from the refusal (UnverifiedError.Revision,
// also the 403's header and the gRPC detail) and walks down from there,
// each refused try raising nothing. Were a waiter's token confirmed, the
// first number accepted would be the newest waiter's key, and the live
// holder would be stale for as long as it holds (found by a cold review
// of the first version of the verifier, which confirmed waiters).
func TestScanFromRevisionFindsNoWaiterToken(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	ctx := etcdproc.Ctx(t, 30*time.Second)
	name := etcdproc.Name(t, "scan/waiter")
	store, err := fencestore.NewEtcdStore(cli, etcdproc.Name(t, "records")+"/")
	if err != nil {
		t.Fatal(err)
	}
	s1, s2 := newSession(t, cli), newSession(t, cli)
	holder, err := s1.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Accept(ctx, name, holder.Token()); err != nil {
		t.Fatalf("holder: %v", err)
	}

	wctx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	waited := make(chan error, 1)
	go func() {
		l, err := s2.Lock(wctx, name)
		if err == nil {
			err = l.Unlock(context.Background())
		}
		waited <- err
	}()
	waiter := keyOf(t, cli, name, s2)

	// The forger: one refused number tells it etcd's revision.
	var ue *fence.UnverifiedError
	if err := store.Accept(ctx, name, forged); !errors.As(err, &ue) {
		t.Fatalf("forged: %v", err)
	}
	var taken int64
	for tok := ue.Revision; tok > holder.Token(); tok-- {
		err := store.Accept(ctx, name, tok)
		if err == nil {
			taken = tok
			break
		}
		if !errors.Is(err, fence.ErrUnverified) {
			t.Fatalf("token %d: %v", tok, err)
		}
	}

	// The waiter gives up: it never held the lock.
	stopWaiting()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("waiter: %v", err)
	}
	if taken != 0 {
		t.Errorf("a client with no holding raised the record to %d (the waiter's key: %d), scanning down from revision %d",
			taken, waiter, ue.Revision)
	}
	if err := store.Accept(ctx, name, holder.Token()); err != nil {
		t.Errorf("the live holder (token %d, still holding) is refused: %v", holder.Token(), err)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
