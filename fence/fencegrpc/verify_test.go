package fencegrpc_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencegrpc"
	"github.com/leasefence/leasefence/fence/fencestore"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// forged is a well-formed token no etcd will reach for years.
const forged = 9000000000000000000

// countingVerifier counts the reads of the real verifier it wraps.
type countingVerifier struct {
	fencestore.Verifier
	reads atomic.Int64
}

func (c *countingVerifier) Verify(ctx context.Context, name string, token int64) error {
	c.reads.Add(1)
	return c.Verifier.Verify(ctx, name, token)
}

// wantUnverified checks a refusal of token as no live holding of name: a
// *fence.UnverifiedError for errors.As, PermissionDenied for gRPC, and
// its ErrorInfo.
func wantUnverified(t *testing.T, err error, name string, token int64) {
	t.Helper()
	var ue *fence.UnverifiedError
	if !errors.As(err, &ue) || ue.Name != name || ue.Token != token || ue.Revision <= 0 || status.Code(err) != codes.PermissionDenied {
		t.Fatalf("err = %v (code %v), want token %d of %q unverified, PermissionDenied", err, status.Code(err), token, name)
	}
	if got, ok := fencegrpc.UnverifiedFrom(err); !ok || *got != *ue {
		t.Fatalf("UnverifiedFrom = %v, %v", got, ok)
	}
}

// A forged token and a forged claim are refused with PermissionDenied and
// raise nothing, on unary calls and streams; the real holder's next call
// passes; a holding costs the Checker one read.
func TestVerifiedChecker(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	v, err := fencestore.NewEtcdVerifier(cli)
	if err != nil {
		t.Fatal(err)
	}
	cv := &countingVerifier{Verifier: v}
	for kind, mk := range map[string]func(name string) (fencestore.Store, []fencegrpc.Option, func() int64){
		"memory": func(name string) (fencestore.Store, []fencegrpc.Option, func() int64) {
			s := fencestore.NewMemoryStore()
			return s, []fencegrpc.Option{fencegrpc.WithVerifier(cv)}, func() int64 { return s.Highest(name) }
		},
		"etcd": func(name string) (fencestore.Store, []fencegrpc.Option, func() int64) {
			s, err := fencestore.NewEtcdStore(cli, etcdproc.Name(t, "records")+"/", fencestore.WithVerifier(cv))
			if err != nil {
				t.Fatal(err)
			}
			return s, nil, func() int64 {
				h, err := fence.ReadRecord(context.Background(), cli, s.Key(name))
				if err != nil {
					t.Fatal(err)
				}
				return h
			}
		},
	} {
		t.Run(kind, func(t *testing.T) {
			ctx := etcdproc.Ctx(t, 30*time.Second)
			name := etcdproc.Name(t, "ledger")
			store, opts, highest := mk(name)
			l := &ledger{}
			cl := serve(t, l, store, append(opts, fencegrpc.WithLockName(name)))
			s, err := lease.NewSession(ctx, cli)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			h, err := s.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			reads := cv.reads.Load()
			for _, body := range []string{"a", "b", "c"} {
				if _, err := cl.UnaryCall(ctx, request(body), fencegrpc.WithHolder(h)); err != nil {
					t.Fatal(err)
				}
			}
			if n := cv.reads.Load() - reads; n != 1 {
				t.Fatalf("%d verifier reads for one holding's 3 calls, want 1", n)
			}
			bad := holder{name, forged}
			_, err = cl.UnaryCall(ctx, request("forged"), fencegrpc.WithHolder(bad))
			wantUnverified(t, err, name, forged)
			_, err = cl.UnaryCall(ctx, request("claim"), fencegrpc.WithHolder(bad), fencegrpc.WithClaim())
			wantUnverified(t, err, name, forged)
			duplex, err := cl.FullDuplexCall(ctx, fencegrpc.WithHolder(bad))
			if err == nil {
				_, err = duplex.Recv()
			}
			wantUnverified(t, err, name, forged)
			if got := highest(); got != h.Token() {
				t.Fatalf("highest %d after forged calls, want the holder's %d", got, h.Token())
			}
			if _, err := cl.UnaryCall(ctx, request("d"), fencegrpc.WithHolder(h)); err != nil {
				t.Fatalf("holder after forged calls: %v", err)
			}
			if entries, calls := l.snapshot(); len(entries) != 4 || calls != 4 {
				t.Fatalf("ledger %v after %d handler runs, want the holder's 4", entries, calls)
			}
		})
	}
}

// A verifier that cannot reach etcd: Unavailable, the handler does not
// run, and the store is unchanged.
func TestVerifierUnreachable(t *testing.T) {
	etcdproc.LeakCheck(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dead, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	v, err := fencestore.NewEtcdVerifier(dead, fencestore.WithReadTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	store := fencestore.NewMemoryStore()
	l := &ledger{}
	cl := serve(t, l, store, []fencegrpc.Option{fencegrpc.WithLockName("ledger"), fencegrpc.WithVerifier(v)})
	ctx := etcdproc.Ctx(t, 30*time.Second)
	for _, claim := range []bool{false, true} {
		_, err := cl.UnaryCall(ctx, request("x"), fencegrpc.WithHolder(holder{"ledger", 42}), claimOpt(claim))
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("claim %v: %v, want Unavailable", claim, err)
		}
	}
	if _, calls := l.snapshot(); calls != 0 || store.Highest("ledger") != 0 {
		t.Fatalf("%d handler runs, highest %d, want none", calls, store.Highest("ledger"))
	}
}
