// Command grpcledger runs a small gRPC ledger service whose appends are
// fenced by package fence/fencegrpc, and two workers that hold the writer
// lock in turn: the late Append of a worker that lost its lock is refused.
//
// The service runs in this process, on loopback, and keeps its ledger in
// etcd, one key per entry. It is defined by hand, with a grpc.ServiceDesc
// and well-known protobuf messages: no protoc. A fencegrpc.Checker checks
// its calls: Append must carry a token of the writer lock, and its handler
// writes the entry with a fence.Txn guarded by fencestore.EtcdStore.Guard,
// the one atomic check (fencegrpc.WithCheckInHandler); Read passes without
// a token, unless it is a claim.
//
// Worker A, a separate process, takes the lock and calls the service
// through fencegrpc's client interceptor, with its lock as the holder of
// every call (fencegrpc.WithHolder). It claims and reads the ledger in one
// call (fencegrpc.WithClaim), appends an entry, and starts a second
// Append: the interceptor finds lock.Err() nil and attaches A's token, and
// A is then really stopped (SIGSTOP) past its lease before the request
// leaves. etcd expires the lease; worker B takes the lock with a larger
// token, claims and reads the ledger, and appends. A is resumed (SIGCONT)
// and its request goes out: the service refuses it with codes.Aborted, an
// error that errors.As turns into a *fence.StaleError naming both tokens.
// A's next Append is refused before it is sent: its lock is known lost by
// then.
//
// With neither -endpoints nor ETCD_ENDPOINTS it starts an embedded etcd.
// The exit status is 0 only if A's late Append was refused so, and the
// ledger holds A's entry, then B's.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/leasefence/leasefence/examples/internal/exampleetcd"
	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencegrpc"
	"github.com/leasefence/leasefence/fence/fencestore"
	"github.com/leasefence/leasefence/internal/exampleenv"
	"github.com/leasefence/leasefence/lease"
)

// The ledger service, and the full names of its methods.
const (
	serviceName  = "leasefence.example.Ledger"
	appendMethod = "/" + serviceName + "/Append"
	readMethod   = "/" + serviceName + "/Read"
)

// Environment of the child process, worker A.
const (
	envEndpoints = "GRPCLEDGER_ENDPOINTS"
	envServer    = "GRPCLEDGER_SERVER"
	envLock      = "GRPCLEDGER_LOCK"
	envTTL       = "GRPCLEDGER_TTL"
)

func main() {
	if os.Getenv(exampleenv.ChildEnv) == "worker-a" {
		if err := workerA(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "worker A:", err)
			os.Exit(1)
		}
		return
	}
	endpoints := flag.String("endpoints", "", "etcd client URLs, comma-separated (default $ETCD_ENDPOINTS, else an embedded etcd)")
	ttl := flag.Duration("ttl", 2*time.Second, "lease TTL of both workers (etcd grants at least 2s by default)")
	flag.Parse()
	if _, err := run(*endpoints, *ttl, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "grpcledger:", err)
		os.Exit(1)
	}
}

// ledgerService is the service's interface: Append adds an entry, Read
// returns them all, oldest first.
type ledgerService interface {
	Append(context.Context, *wrapperspb.StringValue) (*emptypb.Empty, error)
	Read(context.Context, *emptypb.Empty) (*structpb.ListValue, error)
}

// ledgerDesc is what protoc would generate for the service.
var ledgerDesc = grpc.ServiceDesc{
	ServiceName: serviceName,
	HandlerType: (*ledgerService)(nil),
	Methods: []grpc.MethodDesc{
		unary("Append", ledgerService.Append),
		unary("Read", ledgerService.Read),
	},
}

// unary is the method description of a unary method: it decodes the
// request and runs call through the server's interceptors.
func unary[Req, Resp any](name string, call func(ledgerService, context.Context, *Req) (*Resp, error)) grpc.MethodDesc {
	return grpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, intercept grpc.UnaryServerInterceptor) (any, error) {
		req := new(Req)
		if err := dec(req); err != nil {
			return nil, err
		}
		handler := func(ctx context.Context, req any) (any, error) { return call(srv.(ledgerService), ctx, req.(*Req)) }
		if intercept == nil {
			return handler(ctx, req)
		}
		return intercept(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/" + serviceName + "/" + name}, handler)
	}}
}

// ledger implements the service over etcd: each entry is a key under
// prefix, written in the same etcd transaction as the fence check of its
// call's token.
type ledger struct {
	cli    *clientv3.Client
	store  *fencestore.EtcdStore
	prefix string
	seq    atomic.Int64 // names entries; several replicas would add their own name
}

// Append writes the entry only if the call's token is not stale, checked
// in the same etcd transaction: with WithCheckInHandler, the Checker has
// read the token but not checked it.
func (l *ledger) Append(ctx context.Context, req *wrapperspb.StringValue) (*emptypb.Empty, error) {
	claim, ok := fencegrpc.ClaimFrom(ctx) // the lock and token the call carries, read by the Checker
	if !ok {
		return nil, status.Error(codes.Internal, "Append is not fenced")
	}
	key := fmt.Sprintf("%s%08d", l.prefix, l.seq.Add(1))
	_, err := fence.NewTxn(ctx, l.cli, l.store.Guard(claim)).Then(clientv3.OpPut(key, req.GetValue())).Commit()
	if err != nil {
		return nil, fencegrpc.Error(claim, err) // Aborted, naming both tokens, if the token is stale
	}
	return &emptypb.Empty{}, nil
}

// Read returns the entries in the order etcd committed them. A claim has
// been recorded by the Checker before it runs.
func (l *ledger) Read(ctx context.Context, _ *emptypb.Empty) (*structpb.ListValue, error) {
	resp, err := l.cli.Get(ctx, l.prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	entries := &structpb.ListValue{}
	for _, kv := range resp.Kvs {
		entries.Values = append(entries.Values, structpb.NewStringValue(string(kv.Value)))
	}
	return entries, nil
}

// serve starts the ledger service on loopback, its Appends fenced by
// lockName's tokens, recorded in etcd under prefix. It returns the
// server's address and a function that stops it.
func serve(cli *clientv3.Client, prefix, lockName string) (string, func(), error) {
	store, err := fencestore.NewEtcdStore(cli, prefix+"fences/")
	if err != nil {
		return "", nil, err
	}
	checker, err := fencegrpc.NewChecker(store,
		fencegrpc.WithLockName(lockName),           // the server decides which lock fences the service
		fencegrpc.WithUncheckedMethods(readMethod), // a Read with no token passes; a claim is checked
		fencegrpc.WithCheckInHandler())             // Append's fence.Txn makes the check
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	// A service with streams adds checker.StreamServerInterceptor() with
	// grpc.ChainStreamInterceptor, and its clients StreamClientInterceptor.
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(checker.UnaryServerInterceptor()))
	srv.RegisterService(&ledgerDesc, &ledger{cli: cli, store: store, prefix: prefix + "entries/"})
	go srv.Serve(ln)
	return ln.Addr().String(), srv.Stop, nil
}

// dial connects to the ledger service through fencegrpc's client
// interceptor, with h as the holder of every call, then through more.
func dial(addr string, h fence.Holder, more ...grpc.UnaryClientInterceptor) (*grpc.ClientConn, error) {
	chain := append([]grpc.UnaryClientInterceptor{fencegrpc.UnaryClientInterceptor(fencegrpc.WithHolder(h))}, more...)
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithChainUnaryInterceptor(chain...))
}

// appendEntry calls Append.
func appendEntry(ctx context.Context, conn grpc.ClientConnInterface, entry string, opts ...grpc.CallOption) error {
	return conn.Invoke(ctx, appendMethod, wrapperspb.String(entry), &emptypb.Empty{}, opts...)
}

// readLedger calls Read.
func readLedger(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) ([]string, error) {
	var list structpb.ListValue
	if err := conn.Invoke(ctx, readMethod, &emptypb.Empty{}, &list, opts...); err != nil {
		return nil, err
	}
	entries := []string{}
	for _, v := range list.GetValues() {
		entries = append(entries, v.GetStringValue())
	}
	return entries, nil
}

// errUnsafe: the fence did not keep A's late Append out.
var errUnsafe = errors.New("worker A's late Append was not refused as stale, or the ledger is not A's entries then B's")

// outcome is what a run ended with.
type outcome struct {
	aToken, bToken     int64
	aEntries, bEntries []string // the entries each appended before A's stop
	code               string   // of A's late Append
	offered, highest   int64    // the tokens of its *fence.StaleError, if it was one
	ledger             []string // at the end
}

func (o outcome) safe() bool {
	return o.code == codes.Aborted.String() && o.offered == o.aToken && o.highest == o.bToken &&
		o.aToken < o.bToken && slices.Equal(o.ledger, slices.Concat(o.aEntries, o.bEntries))
}

func (o outcome) summary() string {
	if o.safe() {
		return fmt.Sprintf("SAFE: A's late Append with token %d refused (%s, a *fence.StaleError naming tokens %d and %d); the ledger is %q",
			o.aToken, o.code, o.offered, o.highest, o.ledger)
	}
	return fmt.Sprintf("UNSAFE: A's late Append with token %d got %s (stale error naming %d and %d); the ledger is %q, want %q",
		o.aToken, o.code, o.offered, o.highest, o.ledger, slices.Concat(o.aEntries, o.bEntries))
}

func run(endpoints string, ttl time.Duration, out io.Writer) (outcome, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli, closeEtcd, err := exampleetcd.Connect(ctx, endpoints, out)
	if err != nil {
		return outcome{}, err
	}
	defer closeEtcd()
	prefix := fmt.Sprintf("grpcledger-%x/", time.Now().UnixNano()&0xffffff)
	s := &scene{ctx: ctx, cli: cli, ttl: ttl, tl: exampleenv.NewTimeline(out), lockName: prefix + "writer"}
	defer s.closers.Run()
	addr, stop, err := serve(cli, prefix, s.lockName)
	if err != nil {
		return outcome{}, err
	}
	s.closers.Add(stop)
	s.addr = addr
	s.tl.Printf("server", "ledger service on %s: Append fenced by lock %q, Read unchecked unless a claim", addr, s.lockName)
	res, err := s.play()
	if err != nil {
		return res, err
	}
	fmt.Fprintln(out, res.summary())
	if !res.safe() {
		return res, errUnsafe
	}
	return res, nil
}

// scene is one run of the story: worker A (a child process), worker B
// and a reader (this process), on one lock and one ledger service.
type scene struct {
	ctx      context.Context
	cli      *clientv3.Client
	ttl      time.Duration
	tl       *exampleenv.Timeline
	lockName string
	addr     string // the ledger service's
	a        *exampleenv.Child
	closers  exampleenv.Cleanup
}

func (s *scene) play() (outcome, error) {
	var res outcome
	a, err := exampleenv.StartChild(s.ctx, "worker A", "worker-a",
		envEndpoints+"="+strings.Join(s.cli.Endpoints(), ","), envServer+"="+s.addr,
		envLock+"="+s.lockName, envTTL+"="+s.ttl.String())
	if err != nil {
		return res, err
	}
	defer a.Stop()
	s.a = a
	s.tl.Printf("A", "started as process %d", a.Pid())
	if err := s.aAppends(&res); err != nil {
		return res, err
	}
	if err := exampleenv.PauseUntilExpired(s.ctx, s.cli, s.a, s.lockName, s.tl); err != nil {
		return res, err
	}
	if err := s.bTakesOver(&res); err != nil {
		return res, err
	}
	if err := s.aResumes(&res); err != nil {
		return res, err
	}
	res.ledger, err = s.read()
	return res, err
}

// aAppends follows A through its holding, up to the Append it is stopped
// in.
func (s *scene) aAppends(res *outcome) error {
	tok, err := s.a.Expect("LOCKED ", 30*time.Second)
	if err != nil {
		return err
	}
	res.aToken, _ = strconv.ParseInt(tok, 10, 64)
	s.tl.Printf("A", "takes the lock: token %d, lease TTL %v", res.aToken, s.ttl)
	read, err := s.a.Expect("CLAIMED ", 10*time.Second)
	if err != nil {
		return err
	}
	s.tl.Printf("A", "claims and reads the ledger in one call (Read with WithClaim): %s", read)
	entry, err := s.a.Expect("APPENDED ", 10*time.Second)
	if err != nil {
		return err
	}
	res.aEntries = append(res.aEntries, entry)
	s.tl.Printf("A", "appends %q: accepted", entry)
	late, err := s.a.Expect("APPENDING ", 10*time.Second)
	if err != nil {
		return err
	}
	sent, err := s.a.Expect("SENDING ", 10*time.Second)
	if err != nil {
		return err
	}
	s.tl.Printf("A", "appends %q: its interceptor finds lock.Err() nil and attaches token %s...", late, sent)
	return nil
}

// bTakesOver takes the lock for B, claims and reads the ledger, and
// appends B's entry.
func (s *scene) bTakesOver(res *outcome) error {
	sb, err := lease.NewSession(s.ctx, s.cli, lease.WithTTL(s.ttl))
	if err != nil {
		return err
	}
	s.closers.Add(func() { sb.Close() })
	lb, err := sb.Lock(s.ctx, s.lockName)
	if err != nil {
		return err
	}
	s.closers.Add(func() { _ = lb.Unlock(s.ctx) })
	res.bToken = lb.Token()
	s.tl.Printf("B", "takes the lock: token %d (> %d)", lb.Token(), res.aToken)
	conn, err := dial(s.addr, lb)
	if err != nil {
		return err
	}
	s.closers.Add(func() { conn.Close() })
	entries, err := readLedger(s.ctx, conn, fencegrpc.WithClaim())
	if err != nil {
		return err
	}
	s.tl.Printf("B", "claims and reads the ledger in one call: %q", entries)
	entry := fmt.Sprintf("B1 (token %d)", lb.Token())
	if err := appendEntry(s.ctx, conn, entry); err != nil {
		return err
	}
	res.bEntries = append(res.bEntries, entry)
	s.tl.Printf("B", "appends %q: accepted", entry)
	return nil
}

// aResumes continues A, whose Append goes out with its old token, and
// records what it got.
func (s *scene) aResumes(res *outcome) error {
	if err := s.a.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	s.tl.Printf("A", "resumes: SIGCONT. Its Append goes out with token %d", res.aToken)
	if err := s.a.Send("go"); err != nil {
		return err
	}
	got, err := s.a.Expect("LATE ", 30*time.Second)
	if err != nil {
		return err
	}
	// code, the stale error's two tokens, the error's text
	f := strings.SplitN(got, " ", 4)
	if len(f) < 4 {
		return fmt.Errorf("worker A: bad line %q", got)
	}
	res.code = f[0]
	res.offered, _ = strconv.ParseInt(f[1], 10, 64)
	res.highest, _ = strconv.ParseInt(f[2], 10, 64)
	if res.offered != 0 {
		s.tl.Printf("A", "Append REFUSED by the service: %s: %s", f[0], f[3])
		s.tl.Printf("A", "errors.As finds a *fence.StaleError: token %d offered, %d accepted", res.offered, res.highest)
	} else {
		s.tl.Printf("A", "Append: %s: %s", f[0], f[3])
	}
	if lost, err := s.a.Expect("LOCKERR ", 10*time.Second); err == nil {
		s.tl.Printf("A", "lock.Err() now says %q", lost)
	}
	if again, err := s.a.Expect("AGAIN ", 10*time.Second); err == nil {
		s.tl.Printf("A", "appends again: refused before sending: %s", again)
	}
	if err := s.a.Wait(); err != nil {
		return fmt.Errorf("worker A: %v\n%s", err, s.a.Stderr())
	}
	return nil
}

// read reads the ledger as a reader holding no lock: Read is unchecked.
func (s *scene) read() ([]string, error) {
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	entries, err := readLedger(s.ctx, conn)
	if err != nil {
		return nil, err
	}
	s.tl.Printf("reader", "reads the ledger, with no token: %q", entries)
	return entries, nil
}

// workerA is the child process: it takes the lock, claims and reads the
// ledger, appends an entry, and starts a second Append, which waits for a
// line on stdin (during which it is stopped) once fencegrpc's interceptor
// has passed it.
func workerA(in io.Reader, out io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ttl, err := time.ParseDuration(os.Getenv(envTTL))
	if err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(os.Getenv(envEndpoints), ","), DialTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer cli.Close()
	s, err := lease.NewSession(ctx, cli, lease.WithTTL(ttl))
	if err != nil {
		return err
	}
	defer s.Close()
	l, err := s.Lock(ctx, os.Getenv(envLock))
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "LOCKED", l.Token())
	conn, err := dial(os.Getenv(envServer), l, pauseAfterCheck(bufio.NewReader(in), out))
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := aFirstAppend(ctx, out, conn, l.Token()); err != nil {
		return err
	}
	late := fmt.Sprintf("A2 (token %d)", l.Token())
	fmt.Fprintln(out, "APPENDING", late)
	err = appendEntry(ctx, conn, late, pauseHere{})
	var stale *fence.StaleError // what the client interceptor's error for a stale refusal holds
	if errors.As(err, &stale) {
		fmt.Fprintln(out, "LATE", status.Code(err), stale.Token, stale.Highest, err)
	} else {
		fmt.Fprintln(out, "LATE", status.Code(err), 0, 0, err)
	}
	<-l.Done()
	fmt.Fprintln(out, "LOCKERR", l.Err())
	err = appendEntry(ctx, conn, fmt.Sprintf("A3 (token %d)", l.Token()))
	fmt.Fprintf(out, "AGAIN %s: %v\n", status.Code(err), err)
	return nil
}

// aFirstAppend claims and reads the ledger, and appends A's first entry.
func aFirstAppend(ctx context.Context, out io.Writer, conn grpc.ClientConnInterface, token int64) error {
	entries, err := readLedger(ctx, conn, fencegrpc.WithClaim())
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "CLAIMED %q\n", entries)
	entry := fmt.Sprintf("A1 (token %d)", token)
	if err := appendEntry(ctx, conn, entry); err != nil {
		return err
	}
	fmt.Fprintln(out, "APPENDED", entry)
	return nil
}

// pauseHere marks the call that pauseAfterCheck holds up.
type pauseHere struct{ grpc.EmptyCallOption }

// pauseAfterCheck is a client interceptor that runs after fencegrpc's: a
// call given pauseHere prints SENDING and the token fencegrpc attached,
// and waits for a line on in before it goes on. The parent stops A there,
// where a real process can be paused as anywhere else (garbage
// collection, swapping, a stalled VM): past the interceptor's check of
// lock.Err(), before the request has left.
func pauseAfterCheck(in *bufio.Reader, out io.Writer) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		for _, o := range opts {
			if _, ok := o.(pauseHere); !ok {
				continue
			}
			md, _ := metadata.FromOutgoingContext(ctx)
			fmt.Fprintln(out, "SENDING", strings.Join(md.Get(fencegrpc.MetadataToken), ","))
			if _, err := in.ReadString('\n'); err != nil {
				return err
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}
