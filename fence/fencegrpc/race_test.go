package fencegrpc_test

import (
	"context"
	"errors"
	"io"
	"math/rand"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencegrpc"
	"github.com/leasefence/leasefence/fence/fencestore"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// Claims racing writes made on streams of many holders, every write
// through the Store's atomic step: the writes applied never go back in
// token order, and once a claim has been answered no write with a lower
// token is applied. Claims mark where they were answered in the order of
// the writes (the ledger's length for the memory store, a revision read
// after the answer for etcd), and every write applied after the mark
// carries at least the claim's token.
func TestClaimsRaceStreamWrites(t *testing.T) {
	for kind, mk := range stores() {
		t.Run(kind, func(t *testing.T) {
			etcdproc.LeakCheck(t)
			sk := mk(t)
			l := &ledger{write: sk.write}
			cl := serve(t, l, sk.store, []fencegrpc.Option{fencegrpc.WithLockName("ledger"), fencegrpc.WithCheckInHandler(), fencegrpc.WithUncheckedMethods(methodEmpty)})
			ctx := etcdproc.Ctx(t, 30*time.Second)

			var cli *clientv3.Client
			var data string
			var from int64
			if kind == "etcd" {
				cli, data = etcd.Client(t), sk.dataKey
				resp, err := cli.Get(ctx, data)
				if err != nil {
					t.Fatal(err)
				}
				from = resp.Header.Revision + 1
			}
			mark := func() int64 {
				if cli == nil {
					entries, _ := l.snapshot()
					return int64(len(entries))
				}
				resp, err := cli.Get(ctx, data)
				if err != nil {
					t.Error(err)
					return 0
				}
				return resp.Header.Revision
			}

			type claimed struct{ token, mark int64 }
			var mu sync.Mutex
			var claims []claimed
			var wg sync.WaitGroup
			rng := rand.New(rand.NewSource(7))
			for g := 0; g < 8; g++ {
				seed := rng.Int63()
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewSource(seed))
					for i := 0; i < 10; i++ {
						h := holder{"ledger", int64(1 + r.Intn(30))}
						var err error
						switch r.Intn(3) {
						case 0:
							_, err = cl.EmptyCall(ctx, &testpb.Empty{}, fencegrpc.WithHolder(h), fencegrpc.WithClaim())
							if err == nil {
								m := mark()
								mu.Lock()
								claims = append(claims, claimed{h.token, m})
								mu.Unlock()
							}
						case 1:
							err = duplexWrites(ctx, cl, h, 3)
						default:
							err = inputWrites(ctx, cl, h, 3)
						}
						if err != nil && !errors.Is(err, fence.ErrStale) {
							t.Errorf("token %d: %v", h.token, err)
						}
					}
				}()
			}
			wg.Wait()

			var toks, marks []int64
			if cli == nil {
				toks = ledgerTokens(l)
				for i := range toks {
					marks = append(marks, int64(i+1)) // the entry's place, 1-based
				}
			} else {
				toks, marks = historyRevs(t, cli, data, from)
			}
			if !slices.IsSorted(toks) {
				t.Fatalf("writes applied out of token order: %v", toks)
			}
			if len(claims) == 0 || len(toks) == 0 {
				t.Fatalf("%d claims, %d writes: the test did not race", len(claims), len(toks))
			}
			for _, c := range claims {
				for i, tok := range toks {
					if marks[i] > c.mark && tok < c.token {
						t.Fatalf("write of token %d applied at %d, after the claim of %d was answered (mark %d)", tok, marks[i], c.token, c.mark)
					}
				}
			}
		})
	}
}

func duplexWrites(ctx context.Context, cl testpb.TestServiceClient, h holder, n int) error {
	s, err := cl.FullDuplexCall(ctx, fencegrpc.WithHolder(h))
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		if err := s.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: []byte("d")}}); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if _, err := s.Recv(); err != nil {
			return err
		}
	}
	s.CloseSend()
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

func inputWrites(ctx context.Context, cl testpb.TestServiceClient, h holder, n int) error {
	s, err := cl.StreamingInputCall(ctx, fencegrpc.WithHolder(h))
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		if err := s.Send(&testpb.StreamingInputCallRequest{Payload: &testpb.Payload{Body: []byte("i")}}); err != nil {
			break // io.EOF: the status comes from CloseAndRecv
		}
	}
	_, err = s.CloseAndRecv()
	return err
}

// historyRevs is history with the revision of each write.
func historyRevs(t *testing.T, cli *clientv3.Client, key string, from int64) (toks, revs []int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
	defer cancel()
	now, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(now.Kvs) == 0 || now.Kvs[0].ModRevision < from {
		return nil, nil
	}
	last := now.Kvs[0].ModRevision
	for wr := range cli.Watch(ctx, key, clientv3.WithRev(from)) {
		if err := wr.Err(); err != nil {
			t.Fatal(err)
		}
		for _, ev := range wr.Events {
			tok, err := fencestore.ParseToken(string(ev.Kv.Value))
			if err != nil {
				t.Fatal(err)
			}
			toks, revs = append(toks, tok), append(revs, ev.Kv.ModRevision)
			if ev.Kv.ModRevision >= last {
				return toks, revs
			}
		}
	}
	t.Fatal("watch ended before the history was read")
	return nil, nil
}
