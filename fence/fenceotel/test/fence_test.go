package fenceotel_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	_ "modernc.org/sqlite"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencegrpc"
	"github.com/leasefence/leasefence/fence/fencehttp"
	"github.com/leasefence/leasefence/fence/fenceotel"
	"github.com/leasefence/leasefence/fence/fencestore"
	"github.com/leasefence/leasefence/fence/sqlfence"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// A stale commit through etcd is a span, a child of the caller's, marked
// Error with both tokens; the accepted ones are not. The refusal is
// counted as "resource".
func TestStaleCommitSpans(t *testing.T) {
	etcdproc.LeakCheck(t)
	k := newKit(t)
	cli := etcd.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctx, req := k.tp.Tracer("test").Start(ctx, "request")
	defer req.End()
	base := etcdproc.Name(t, "stale")
	rec := base + "-fence"
	for _, tok := range []int64{10, 9} {
		_, err := fence.NewTxn(ctx, cli, fence.Resource(rec, tok)).WithHooks(k.tel.FenceHooks()).Then(clientv3.OpPut(base+"-data", "x")).Commit()
		if (tok == 9) != errors.Is(err, fence.ErrStale) {
			t.Fatalf("token %d: %v", tok, err)
		}
	}
	// One Txn committed twice: each Commit is a child of the caller's span.
	again := fence.NewTxn(ctx, cli, fence.Resource(rec, 10)).WithHooks(k.tel.FenceHooks()).Then(clientv3.OpPut(base+"-data", "z"))
	for range 2 {
		if _, err := again.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	txns := k.ended("fence.Txn.Commit")
	if len(txns) != 4 {
		t.Fatalf("%d commit spans, want 4", len(txns))
	}
	ok, stale := txns[0], txns[1]
	for _, s := range txns {
		if s.Parent().SpanID() != req.SpanContext().SpanID() {
			t.Errorf("commit span is not a child of the caller's")
		}
		wantAttr(t, s, fenceotel.AttrFence.String("etcd"))
		wantAttr(t, s, fenceotel.AttrGuards.StringSlice([]string{"resource"}))
		wantAttr(t, s, fenceotel.AttrKeys.StringSlice([]string{rec}))
	}
	wantAttr(t, ok, fenceotel.AttrVerdict.String("ok"))
	if ok.Status().Code == codes.Error {
		t.Errorf("accepted commit: status %v", ok.Status())
	}
	wantStale(t, stale, 9, 10)
	k.want(t, fenceotel.MetricRefusals, 1, fenceotel.AttrGuard.String("resource"))
}

// A stale write to a SQLite row is a span marked Error with both tokens,
// after a claim's span that is not; the refusal is counted as "sql".
func TestStaleSQLWriteSpans(t *testing.T) {
	k := newKit(t)
	ctx, req := k.tp.Tracer("test").Start(context.Background(), "request")
	defer req.End()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "o.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	f, err := sqlfence.New(sqlfence.SQLite, "rows", "id", sqlfence.WithHooks(k.tel.FenceHooks()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE rows (id TEXT PRIMARY KEY, v TEXT, ` + f.ColumnDDL() + `)`); err != nil {
		t.Fatal(err)
	}
	if err := f.Claim(ctx, db, "r", 5); err != nil {
		t.Fatal(err)
	}
	if err := f.Upsert(ctx, db, "r", 4, sqlfence.Set("v", "four")); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale SQL write: %v", err)
	}
	claims, writes := k.ended("sqlfence.Claim"), k.ended("sqlfence.Write")
	if len(claims) != 1 || len(writes) != 1 {
		t.Fatalf("%d claim and %d write spans, want 1 and 1", len(claims), len(writes))
	}
	wantAttr(t, claims[0], fenceotel.AttrVerdict.String("ok"))
	wantAttr(t, writes[0], fenceotel.AttrKeys.StringSlice([]string{"rows/r"}))
	wantStale(t, writes[0], 4, 5)
	if claims[0].Parent().SpanID() != req.SpanContext().SpanID() {
		t.Errorf("claim span is not a child of the caller's")
	}
	k.want(t, fenceotel.MetricRefusals, 1, fenceotel.AttrGuard.String("sql"))
}

func wantStale(t *testing.T, s sdktrace.ReadOnlySpan, token, highest int64) {
	t.Helper()
	wantAttr(t, s, fenceotel.AttrVerdict.String("stale"))
	wantAttr(t, s, fenceotel.AttrToken.Int64(token))
	wantAttr(t, s, fenceotel.AttrHighest.Int64(highest))
	if s.Status().Code != codes.Error {
		t.Errorf("%s refused: status %v, want Error", s.Name(), s.Status())
	}
}

// An HTTP request refused for a stale token marks the server span otelhttp
// made; the accepted one carries the lock and token, unmarked.
func TestHTTPRefusalMarksServerSpan(t *testing.T) {
	etcdproc.LeakCheck(t)
	k := newKit(t)
	mw, err := fencehttp.NewMiddleware(fencestore.NewMemoryStore(), fencehttp.WithLockName("files"), fencehttp.WithHooks(k.tel.FenceHooks()))
	if err != nil {
		t.Fatal(err)
	}
	h := otelhttp.NewHandler(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })),
		"files", otelhttp.WithTracerProvider(k.tp))
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, tok := range []string{"8", "3"} {
		req, _ := http.NewRequest(http.MethodPut, srv.URL, nil)
		req.Header.Set(fencehttp.HeaderLock, "files")
		req.Header.Set(fencehttp.HeaderToken, tok)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	srv.Client().CloseIdleConnections()
	spans := k.ended("files")
	if len(spans) != 2 {
		t.Fatalf("%d server spans, want 2", len(spans))
	}
	wantMarked(t, spans, "http")
}

// wantMarked checks an accepted request's server span and a refused one's.
func wantMarked(t *testing.T, spans []sdktrace.ReadOnlySpan, kind string) {
	t.Helper()
	ok, refused := spans[0], spans[1]
	for _, s := range spans {
		wantAttr(t, s, fenceotel.AttrFence.String(kind))
		wantAttr(t, s, fenceotel.AttrLockName.String(map[string]string{"http": "files", "grpc": "jobs"}[kind]))
	}
	wantAttr(t, ok, fenceotel.AttrToken.Int64(8))
	wantAttr(t, ok, fenceotel.AttrVerdict.String("ok"))
	if ok.Status().Code == codes.Error {
		t.Errorf("accepted request: status %v", ok.Status())
	}
	wantStale(t, refused, 3, 8)
	if _, found := event(refused, "refused"); !found {
		t.Errorf("refused request's span has no refused event")
	}
}

// A gRPC call refused for a stale token marks the server span otelgrpc
// made.
func TestGRPCRefusalMarksServerSpan(t *testing.T) {
	etcdproc.LeakCheck(t)
	k := newKit(t)
	ck, err := fencegrpc.NewChecker(fencestore.NewMemoryStore(), fencegrpc.WithLockName("jobs"), fencegrpc.WithHooks(k.tel.FenceHooks()))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(k.tp))),
		grpc.ChainUnaryInterceptor(ck.UnaryServerInterceptor()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(lis)
	}()
	stop := sync.OnceFunc(func() {
		srv.Stop()
		<-served
	})
	defer stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(fencegrpc.UnaryClientInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for _, tok := range []int64{8, 3} {
		_, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}, fencegrpc.WithHolder(fixed{"jobs", tok}))
		if (tok == 3) != errors.Is(err, fence.ErrStale) {
			t.Fatalf("token %d: %v", tok, err)
		}
	}
	stop() // the server spans end with their calls; stopping waits for those
	var spans []sdktrace.ReadOnlySpan
	for _, s := range k.spans.Ended() {
		if s.SpanKind() == trace.SpanKindServer {
			spans = append(spans, s)
		}
	}
	if len(spans) != 2 {
		t.Fatalf("%d server spans, want 2", len(spans))
	}
	wantMarked(t, spans, "grpc")
	k.want(t, fenceotel.MetricRefusals, 1, fenceotel.AttrGuard.String("grpc"))
}

type fixed struct {
	name  string
	token int64
}

func (f fixed) Name() string { return f.name }
func (f fixed) Key() string  { return f.name }
func (f fixed) Token() int64 { return f.token }
