package fencegrpc_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencegrpc"
	"github.com/leasefence/leasefence/fence/fencestore"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// Full method names of grpc-go's interop test service, the service of
// these tests: UnaryCall and StreamingInputCall write, EmptyCall reads.
const (
	methodEmpty       = "/grpc.testing.TestService/EmptyCall"
	methodUnary       = "/grpc.testing.TestService/UnaryCall"
	methodInput       = "/grpc.testing.TestService/StreamingInputCall"
	methodFullDuplex  = "/grpc.testing.TestService/FullDuplexCall"
	methodUnfencedRPC = "/grpc.testing.TestService/CacheableUnaryCall"
	methodOutput      = "/grpc.testing.TestService/StreamingOutputCall"
)

// ledger is the protected resource: every write that reached it, in the
// order it was applied, with the claim it was made under. With write set,
// the handler makes its write through it (the Store's atomic step);
// otherwise it appends directly, after the interceptor's check.
type ledger struct {
	testpb.UnimplementedTestServiceServer
	write func(ctx context.Context, c fencestore.Claim, apply func() error) error

	mu      sync.Mutex
	entries []entry
	calls   int // handler runs, refused or not
	hold    func(c fencestore.Claim)
}

type entry struct {
	claim fencestore.Claim
	body  string
}

func (l *ledger) append(ctx context.Context, body string) error {
	c, ok := fencegrpc.ClaimFrom(ctx)
	l.mu.Lock()
	l.calls++
	hold := l.hold
	l.mu.Unlock()
	if !ok {
		return errors.New("no claim in a checked call's context")
	}
	if hold != nil {
		hold(c)
	}
	apply := func() error {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.entries = append(l.entries, entry{c, body})
		return nil
	}
	if l.write == nil {
		return apply()
	}
	if err := l.write(ctx, c, apply); err != nil {
		return fencegrpc.Error(c, err)
	}
	return nil
}

func (l *ledger) snapshot() ([]entry, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]entry(nil), l.entries...), l.calls
}

func (l *ledger) EmptyCall(ctx context.Context, _ *testpb.Empty) (*testpb.Empty, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	return &testpb.Empty{}, nil
}

func (l *ledger) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	if err := l.append(ctx, string(req.GetPayload().GetBody())); err != nil {
		return nil, err
	}
	return &testpb.SimpleResponse{}, nil
}

func (l *ledger) CacheableUnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	return &testpb.SimpleResponse{}, nil
}

// StreamingInputCall appends every message of the stream.
func (l *ledger) StreamingInputCall(s testpb.TestService_StreamingInputCallServer) error {
	n := int32(0)
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return s.SendAndClose(&testpb.StreamingInputCallResponse{AggregatedPayloadSize: n})
		}
		if err != nil {
			return err
		}
		if err := l.append(s.Context(), string(m.GetPayload().GetBody())); err != nil {
			return err
		}
		n++
	}
}

// FullDuplexCall appends every message and answers each.
func (l *ledger) FullDuplexCall(s testpb.TestService_FullDuplexCallServer) error {
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := l.append(s.Context(), string(m.GetPayload().GetBody())); err != nil {
			return err
		}
		if err := s.Send(&testpb.StreamingOutputCallResponse{Payload: m.GetPayload()}); err != nil {
			return err
		}
	}
}

// serve starts a real gRPC server on loopback with the Checker's
// interceptors in front of l, and returns a client whose connection has
// the client interceptors with defaults.
func serve(t *testing.T, l *ledger, store fencestore.Store, opts []fencegrpc.Option, defaults ...fencegrpc.CallOption) testpb.TestServiceClient {
	t.Helper()
	ck, err := fencegrpc.NewChecker(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	conn := dial(t, l, ck,
		grpc.WithChainUnaryInterceptor(fencegrpc.UnaryClientInterceptor(defaults...)),
		grpc.WithChainStreamInterceptor(fencegrpc.StreamClientInterceptor(defaults...)))
	return testpb.NewTestServiceClient(conn)
}

// dial serves l behind ck's interceptors on loopback and returns a
// connection with the given dial options.
func dial(t *testing.T, l *ledger, ck *fencegrpc.Checker, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ck.UnaryServerInterceptor()), grpc.ChainStreamInterceptor(ck.StreamServerInterceptor()))
	testpb.RegisterTestServiceServer(srv, l)
	return connect(t, srv, opts...)
}

// connect serves srv on a loopback port and returns a connection to it
// with the given dial options; the test's cleanup closes the connection,
// stops the server and waits for it.
func connect(t testing.TB, srv *grpc.Server, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(lis)
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		srv.Stop()
		<-done
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		<-done
	})
	return conn
}

func request(body string) *testpb.SimpleRequest {
	return &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte(body)}}
}

// holder is a lock holding as a process that does not know it lost its
// lock sees it: a name and a token, and no Err.
type holder struct {
	name  string
	token int64
}

func (h holder) Name() string { return h.name }
func (h holder) Key() string  { return h.name + "/key" }
func (h holder) Token() int64 { return h.token }

// storeKind is a fresh store with a way to read the highest token recorded
// for a name, the write a handler makes through it in one atomic step with
// the check, and the tokens of the writes that step let through, in the
// order the resource applied them.
type storeKind struct {
	store   fencestore.Store
	highest func(name string) int64
	write   func(ctx context.Context, c fencestore.Claim, apply func() error) error
	applied func(l *ledger) []int64
	dataKey string // etcd: the key the atomic write puts tokens to
}

func stores() map[string]func(t *testing.T) storeKind {
	return map[string]func(t *testing.T) storeKind{
		"memory": memoryStore,
		"etcd":   etcdStore,
	}
}

func memoryStore(t *testing.T) storeKind {
	s := fencestore.NewMemoryStore()
	return storeKind{store: s, highest: s.Highest, write: s.Do, applied: ledgerTokens}
}

func ledgerTokens(l *ledger) []int64 {
	entries, _ := l.snapshot()
	var toks []int64
	for _, e := range entries {
		toks = append(toks, e.claim.Token)
	}
	return toks
}

// etcdStore is an EtcdStore whose atomic write is a fence.Txn guarded by
// the record that puts the token to a data key. The order of the writes is
// etcd's: the data key's history, read back from etcd.
func etcdStore(t *testing.T) storeKind {
	cli := etcd.Client(t)
	prefix := etcdproc.Name(t, "fencegrpc")
	s, err := fencestore.NewEtcdStore(cli, prefix+"/records/", fencestore.WithoutVerifier()) // fixed tokens: verification has its own tests
	if err != nil {
		t.Fatal(err)
	}
	data := prefix + "/data"
	start, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), data)
	if err != nil {
		t.Fatal(err)
	}
	return storeKind{
		store: s,
		highest: func(name string) int64 {
			resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), s.Key(name))
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Kvs) == 0 {
				return 0
			}
			tok, err := fence.DecodeToken(string(resp.Kvs[0].Value))
			if err != nil {
				t.Fatal(err)
			}
			return tok
		},
		write: func(ctx context.Context, c fencestore.Claim, apply func() error) error {
			_, err := fence.NewTxn(ctx, cli, s.Guard(c)).Then(clientv3.OpPut(data, fencestore.FormatToken(c.Token))).Commit()
			if err != nil {
				return err
			}
			return apply()
		},
		applied: func(*ledger) []int64 { return history(t, cli, data, start.Header.Revision+1) },
		dataKey: data,
	}
}

// history is every value key took from revision from on, in etcd's order,
// read as tokens.
func history(t *testing.T, cli *clientv3.Client, key string, from int64) []int64 {
	t.Helper()
	ctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
	defer cancel()
	now, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(now.Kvs) == 0 || now.Kvs[0].ModRevision < from {
		return nil
	}
	last := now.Kvs[0].ModRevision
	var toks []int64
	for wr := range cli.Watch(ctx, key, clientv3.WithRev(from)) {
		if err := wr.Err(); err != nil {
			t.Fatal(err)
		}
		for _, ev := range wr.Events {
			tok, err := fencestore.ParseToken(string(ev.Kv.Value))
			if err != nil {
				t.Fatal(err)
			}
			toks = append(toks, tok)
			if ev.Kv.ModRevision >= last {
				return toks
			}
		}
	}
	t.Fatal("watch ended before the history was read")
	return nil
}
