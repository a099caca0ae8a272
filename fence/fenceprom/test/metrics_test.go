package fenceprom_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	_ "modernc.org/sqlite"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencegrpc"
	"github.com/leasefence/leasefence/fence/fencehttp"
	"github.com/leasefence/leasefence/fence/fenceprom"
	"github.com/leasefence/leasefence/fence/fencestore"
	"github.com/leasefence/leasefence/fence/sqlfence"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

var etcd etcdproc.Env

func TestMain(m *testing.M) { os.Exit(etcd.Main(m, etcdproc.Config{})) }

// value reads one series from the registry: a counter's or gauge's value,
// or a histogram's sample count.
func value(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if matches(m, labels) {
				switch {
				case m.Counter != nil:
					return m.Counter.GetValue()
				case m.Gauge != nil:
					return m.Gauge.GetValue()
				case m.Histogram != nil:
					return float64(m.Histogram.GetSampleCount())
				}
			}
		}
	}
	return 0
}

func matches(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func TestMetricsFromRealEvents(t *testing.T) {
	etcdproc.LeakCheck(t)
	reg := prometheus.NewRegistry()
	m, err := fenceprom.New(fenceprom.WithNameLabel(func(n string) string { return n[:strings.LastIndex(n, "/")] }))
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(m)
	cli := etcd.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base := etcdproc.Name(t, "prom")
	name, label := base+"/7", base // mapped to the prefix
	// The registry is read after events the test awaits: a waiter counted
	// in is one of them, so the hooks also say when one arrives.
	hooks := m.LeaseHooks()
	queued := make(chan struct{}, 8)
	count := hooks.Waiting
	hooks.Waiting = func(name string, delta int) {
		count(name, delta)
		if delta > 0 {
			queued <- struct{}{}
		}
	}
	session := func() *lease.Session {
		s, err := lease.NewSession(ctx, cli, lease.WithTTL(2*time.Second), lease.WithHooks(hooks))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}

	// A handoff: A holds, B waits, A releases, B holds.
	a, b := session(), session()
	la, err := a.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *lease.Lock, 1)
	go func() {
		l, err := b.Lock(ctx, name)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	select {
	case <-queued:
	case <-ctx.Done():
		t.Fatal("B never waited")
	}
	if v := value(t, reg, "leasefence_lock_waiting", "name", label); v != 1 {
		t.Fatalf("waiting = %v while B waits", v)
	}
	if v := value(t, reg, "leasefence_lock_held", "name", label); v != 1 {
		t.Fatalf("held = %v while A holds", v)
	}
	if err := la.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lb := <-got
	if lb == nil {
		t.FailNow()
	}
	if v := value(t, reg, "leasefence_lock_waiting", "name", label); v != 0 {
		t.Fatalf("waiting = %v after the handoff", v)
	}
	if v := value(t, reg, "leasefence_lock_acquire_seconds", "name", label); v != 2 {
		t.Fatalf("acquire observations = %v, want 2", v)
	}

	// A loss: B's key is deleted by someone else.
	if _, err := cli.Delete(ctx, lb.Key()); err != nil {
		t.Fatal(err)
	}
	<-lb.Done()
	if v := value(t, reg, "leasefence_lock_lost_total", "name", label, "cause", "key_deleted"); v != 1 {
		t.Fatalf("lost{key_deleted} = %v", v)
	}
	if v := value(t, reg, "leasefence_lock_held", "name", label); v != 0 {
		t.Fatalf("held = %v after the loss", v)
	}
	if v := value(t, reg, "leasefence_lock_hold_seconds", "name", label); v != 2 {
		t.Fatalf("hold observations = %v, want 2", v)
	}

	// Refusals: etcd Held and Resource guards, a SQL row, an HTTP request.
	rec := base + "-fence"
	if _, err := fence.NewTxn(ctx, cli, fence.Held(lb)).WithHooks(m.FenceHooks()).Then(clientv3.OpPut(base+"-data", "x")).Commit(); !errors.Is(err, fence.ErrNotHeld) {
		t.Fatalf("Held after loss: %v", err)
	}
	if _, err := fence.NewTxn(ctx, cli, fence.Resource(rec, 10)).WithHooks(m.FenceHooks()).Then(clientv3.OpPut(base+"-data", "x")).Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := fence.NewTxn(ctx, cli, fence.Resource(rec, 9)).WithHooks(m.FenceHooks()).Then(clientv3.OpPut(base+"-data", "y")).Commit(); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale Resource write: %v", err)
	}
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "m.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	f, err := sqlfence.New(sqlfence.SQLite, "rows", "id", sqlfence.WithHooks(m.FenceHooks()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE rows (id TEXT PRIMARY KEY, v TEXT, ` + f.ColumnDDL() + `)`); err != nil {
		t.Fatal(err)
	}
	if err := f.Upsert(ctx, db, "r", 5, sqlfence.Set("v", "five")); err != nil {
		t.Fatal(err)
	}
	if err := f.Upsert(ctx, db, "r", 4, sqlfence.Set("v", "four")); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale SQL write: %v", err)
	}
	store := fencestore.NewMemoryStore()
	mw, err := fencehttp.NewMiddleware(store, fencehttp.WithLockName("files"), fencehttp.WithHooks(m.FenceHooks()))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })))
	defer srv.Close()
	for _, tok := range []string{"8", "3"} {
		req, _ := http.NewRequest(http.MethodPut, srv.URL, nil)
		req.Header.Set(fencehttp.HeaderLock, "files")
		req.Header.Set(fencehttp.HeaderToken, tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	refuseGRPC(t, m)
	for guard, want := range map[string]float64{"held": 1, "resource": 1, "sql": 1, "http": 1, "grpc": 1} {
		if v := value(t, reg, "leasefence_fence_refused_total", "guard", guard); v != want {
			t.Errorf("refused{%s} = %v, want %v", guard, v, want)
		}
	}

	// A lost session: its lease is revoked.
	c := session()
	lc, err := c.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, c.Lease()); err != nil {
		t.Fatal(err)
	}
	<-lc.Done()
	<-c.Done()
	if v := value(t, reg, "leasefence_sessions_lost_total"); v != 1 {
		t.Errorf("sessions lost = %v, want 1", v)
	}
	// A revoke deletes the lock key and ends the lease at once: the lock
	// hears of whichever comes first.
	expired := value(t, reg, "leasefence_lock_lost_total", "name", label, "cause", "expired")
	deleted := value(t, reg, "leasefence_lock_lost_total", "name", label, "cause", "key_deleted")
	if expired+deleted != 2 {
		t.Errorf("lost{expired} = %v, lost{key_deleted} = %v, want 2 losses in all", expired, deleted)
	}
	if v := value(t, reg, "leasefence_session_keepalive_margin_seconds"); v < 3 {
		t.Errorf("keep-alive margin observations = %v, want one per session at least", v)
	}
}

// A lease grant that etcd leaves unanswered is counted.
func TestUnansweredGrantCounted(t *testing.T) {
	etcdproc.LeakCheck(t)
	reg := prometheus.NewRegistry()
	m, err := fenceprom.New()
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(m)
	cli, _ := etcdproc.Unanswered(t)
	hooks := m.LeaseHooks()
	reported := make(chan struct{})
	count := hooks.Unanswered
	hooks.Unanswered = func(d time.Duration) {
		count(d)
		close(reported)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := lease.NewSession(ctx, cli, lease.WithHooks(hooks))
		done <- err
	}()
	select {
	case <-reported:
	case err := <-done:
		t.Fatalf("NewSession returned before the grant was reported: %v", err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("NewSession after cancel: %v", err)
	}
	if v := value(t, reg, "leasefence_session_grant_unanswered_total"); v != 1 {
		t.Errorf("unanswered grants = %v, want 1", v)
	}
}

// refuseGRPC has a real gRPC server refuse one stale call, reported through
// m's fence hooks.
func refuseGRPC(t *testing.T, m *fenceprom.Metrics) {
	t.Helper()
	ck, err := fencegrpc.NewChecker(fencestore.NewMemoryStore(), fencegrpc.WithLockName("jobs"), fencegrpc.WithHooks(m.FenceHooks()))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ck.UnaryServerInterceptor()))
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
	defer func() {
		srv.Stop()
		<-served
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithChainUnaryInterceptor(fencegrpc.UnaryClientInterceptor()))
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
}

type fixed struct {
	name  string
	token int64
}

func (f fixed) Name() string { return f.name }
func (f fixed) Key() string  { return f.name }
func (f fixed) Token() int64 { return f.token }
