package fencehttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencehttp"
	"github.com/leasefence/leasefence/fence/fencestore"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// register is the protected resource of these tests: the last body written
// and every write that reached it.
type register struct {
	mu     sync.Mutex
	value  string
	writes int
}

func (g *register) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		g.mu.Lock()
		defer g.mu.Unlock()
		if r.Method == http.MethodGet {
			fmt.Fprint(w, g.value)
			return
		}
		g.value = string(body)
		g.writes++
	})
}

func (g *register) get() (string, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.value, g.writes
}

func serve(t *testing.T, store fencestore.Store, h http.Handler, opts ...fencehttp.Option) *httptest.Server {
	t.Helper()
	mw, err := fencehttp.NewMiddleware(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Wrap(h))
	t.Cleanup(srv.Close)
	return srv
}

func put(t *testing.T, url string, c *fencestore.Claim, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(etcdproc.Ctx(t, 30*time.Second), http.MethodPut, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if c != nil {
		fencehttp.SetHeaders(req.Header, *c)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func newSession(t *testing.T, cli *clientv3.Client) *lease.Session {
	t.Helper()
	s, err := lease.NewSession(etcdproc.Ctx(t, 30*time.Second), cli)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// stores returns a fresh store of each kind, with a way to read the
// highest token recorded for a name.
func stores(t *testing.T) map[string]func(t *testing.T) (fencestore.Store, func(name string) int64) {
	return map[string]func(t *testing.T) (fencestore.Store, func(string) int64){
		"memory": func(t *testing.T) (fencestore.Store, func(string) int64) {
			s := fencestore.NewMemoryStore()
			return s, s.Highest
		},
		"etcd": func(t *testing.T) (fencestore.Store, func(string) int64) {
			cli := etcd.Client(t)
			s, err := fencestore.NewEtcdStore(cli, etcdproc.Name(t, "records")+"/", fencestore.WithoutVerifier()) // fixed tokens: verification has its own tests
			if err != nil {
				t.Fatal(err)
			}
			return s, func(name string) int64 {
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
			}
		},
	}
}

// Two holders in turn, through the Transport, then the first one's late
// request: refused with 409 naming both tokens, and the resource keeps the
// second holder's value.
func TestStaleRequestRefused(t *testing.T) {
	etcdproc.LeakCheck(t)
	for kind, mk := range stores(t) {
		t.Run(kind, func(t *testing.T) {
			cli := etcd.Client(t)
			name := etcdproc.Name(t, "files")
			store, highest := mk(t)
			var reg register
			srv := serve(t, store, reg.handler(), fencehttp.WithLockName(name))

			la, err := newSession(t, cli).Lock(etcdproc.Ctx(t, 30*time.Second), name)
			if err != nil {
				t.Fatal(err)
			}
			clientA := &http.Client{Transport: &fencehttp.Transport{Holder: la}}
			req, _ := http.NewRequestWithContext(etcdproc.Ctx(t, 30*time.Second), http.MethodPut, srv.URL, strings.NewReader("from A"))
			resp, err := clientA.Do(req)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("A's write: %v %v", resp, err)
			}
			resp.Body.Close()
			if req.Header.Get(fencehttp.HeaderToken) != "" {
				t.Error("Transport modified the caller's request")
			}
			if err := la.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
				t.Fatal(err)
			}
			if _, err := clientA.Get(srv.URL); !errors.Is(err, fence.ErrNotHeld) || !errors.Is(err, lease.ErrUnlocked) {
				t.Errorf("Transport of an unlocked holder: %v, want ErrNotHeld and ErrUnlocked", err)
			}

			lb, err := newSession(t, cli).Lock(etcdproc.Ctx(t, 30*time.Second), name)
			if err != nil {
				t.Fatal(err)
			}
			defer lb.Unlock(etcdproc.Ctx(t, 30*time.Second))
			clientB := &http.Client{Transport: &fencehttp.Transport{Holder: lb}}
			resp, err = clientB.Post(srv.URL, "text/plain", strings.NewReader("from B"))
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("B's write: %v %v", resp, err)
			}
			resp.Body.Close()

			// A's request, delayed in the network, arrives now.
			late := put(t, srv.URL, &fencestore.Claim{Name: la.Name(), Token: la.Token()}, "late A")
			if late.StatusCode != http.StatusConflict {
				t.Fatalf("late write: status %d, want 409", late.StatusCode)
			}
			var body struct {
				Error          string
				Token, Highest int64
			}
			if err := json.NewDecoder(late.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			if body.Token != la.Token() || body.Highest != lb.Token() ||
				!strings.Contains(body.Error, fmt.Sprint(la.Token())) || !strings.Contains(body.Error, fmt.Sprint(lb.Token())) {
				t.Errorf("409 body %+v does not name both tokens %d and %d", body, la.Token(), lb.Token())
			}
			var se *fence.StaleError
			if err := fencehttp.CheckResponse(late); !errors.As(err, &se) || se.Token != la.Token() || se.Highest != lb.Token() {
				t.Errorf("CheckResponse = %v", err)
			}
			if v, n := reg.get(); v != "from B" || n != 2 {
				t.Errorf("resource = %q after %d writes, want B's after 2", v, n)
			}
			if h := highest(name); h != lb.Token() {
				t.Errorf("store's highest = %d, want %d", h, lb.Token())
			}
		})
	}
}

// A bad header is a 400 that says what is wrong; the handler never runs and
// the store is unchanged.
func TestBadRequestsNeverPass(t *testing.T) {
	etcdproc.LeakCheck(t)
	for kind, mk := range stores(t) {
		t.Run(kind, func(t *testing.T) {
			store, highest := mk(t)
			var reg register
			srv := serve(t, store, reg.handler(), fencehttp.WithLockName("files"))
			if resp := put(t, srv.URL, &fencestore.Claim{Name: "files", Token: 100}, "ok"); resp.StatusCode != http.StatusOK {
				t.Fatalf("valid write: %d", resp.StatusCode)
			}
			cases := []struct {
				name, lock, token, inBody string
			}{
				{"missing token", "files", "", "Leasefence-Token is missing"},
				{"malformed", "files", "12a", "only decimal digits"},
				{"negative", "files", "-200", "only decimal digits"},
				{"overflowing", "files", "99999999999999999999", "too long"},
				{"wrong lock", "other", "500", `fenced by \"files\"`},
			}
			for _, tc := range cases {
				req, _ := http.NewRequestWithContext(etcdproc.Ctx(t, 30*time.Second), http.MethodPut, srv.URL, strings.NewReader("bad"))
				req.Header.Set(fencehttp.HeaderLock, tc.lock)
				if tc.token != "" {
					req.Header.Set(fencehttp.HeaderToken, tc.token)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), tc.inBody) {
					t.Errorf("%s: %d %s, want 400 mentioning %q", tc.name, resp.StatusCode, b, tc.inBody)
				}
			}
			if v, n := reg.get(); v != "ok" || n != 1 {
				t.Errorf("resource = %q after %d writes: a bad request got through", v, n)
			}
			if h := highest("files"); h != 100 {
				t.Errorf("highest = %d after bad requests, want 100", h)
			}
			if h := highest("other"); h != 0 {
				t.Errorf("a record for the wrong lock was written: %d", h)
			}
		})
	}
}

func TestUncheckedMethods(t *testing.T) {
	etcdproc.LeakCheck(t)
	var reg register
	store := fencestore.NewMemoryStore()
	reads := serve(t, store, reg.handler(), fencehttp.WithLockName("files"))
	if resp, err := http.Get(reads.URL); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET without a token, default options: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	all := serve(t, store, reg.handler(), fencehttp.WithLockName("files"), fencehttp.WithUncheckedMethods())
	if resp, err := http.Get(all.URL); err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("GET without a token, every method checked: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
}

// A handler whose write must be ordered makes it in the same etcd
// transaction as the check. Token 5's request passes the middleware, then
// waits while token 6's request passes and writes: 5's write is refused.
func TestHandlerWriteAtomicWithCheck(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	store, err := fencestore.NewEtcdStore(cli, etcdproc.Name(t, "records")+"/", fencestore.WithoutVerifier()) // fixed tokens: verification has its own tests
	if err != nil {
		t.Fatal(err)
	}
	data := etcdproc.Name(t, "object")
	passed, release := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := fencehttp.ClaimFrom(r.Context())
		if !ok {
			t.Error("no claim in a checked request's context")
		}
		body, _ := io.ReadAll(r.Body)
		if c.Token == 5 {
			close(passed)
			<-release
		}
		_, err := fence.NewTxn(r.Context(), cli, store.Guard(c)).Then(clientv3.OpPut(data, string(body))).Commit()
		if err != nil {
			fencehttp.WriteError(w, c, err)
		}
	})
	srv := serve(t, store, h, fencehttp.WithLockName("obj"))

	slow := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequestWithContext(etcdproc.Ctx(t, 30*time.Second), http.MethodPut, srv.URL, strings.NewReader("token 5"))
		fencehttp.SetHeaders(req.Header, fencestore.Claim{Name: "obj", Token: 5})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
		}
		slow <- resp
	}()
	<-passed
	if resp := put(t, srv.URL, &fencestore.Claim{Name: "obj", Token: 6}, "token 6"); resp.StatusCode != http.StatusOK {
		t.Fatalf("token 6: %d", resp.StatusCode)
	}
	close(release)
	resp := <-slow
	if resp == nil {
		t.FailNow()
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Errorf("token 5's write after token 6's: %d, want 409", resp.StatusCode)
	}
	got, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), data)
	if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "token 6" {
		t.Fatalf("object = %v %v, want token 6's", got.Kvs, err)
	}
}

// storeFunc adapts a function to Store: here, to stand for a store that
// cannot answer, which a live etcd does not do on demand.
type storeFunc func(ctx context.Context, name string, token int64) error

func (f storeFunc) Accept(ctx context.Context, name string, token int64) error {
	return f(ctx, name, token)
}

func TestStoreFailureIs503(t *testing.T) {
	etcdproc.LeakCheck(t)
	var reg register
	down := storeFunc(func(context.Context, string, int64) error {
		return fmt.Errorf("fence: commit: %w", fence.ErrOutcomeUnknown)
	})
	srv := serve(t, down, reg.handler(), fencehttp.WithLockName("files"))
	if resp := put(t, srv.URL, &fencestore.Claim{Name: "files", Token: 1}, "x"); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("status %d, want 503", resp.StatusCode)
	}
	if _, n := reg.get(); n != 0 {
		t.Error("handler ran although the store failed")
	}
}

func TestNewMiddlewareBadInput(t *testing.T) {
	etcdproc.LeakCheck(t)
	store := fencestore.NewMemoryStore()
	cases := []struct {
		name  string
		store fencestore.Store
		opts  []fencehttp.Option
	}{
		{"nil store", nil, []fencehttp.Option{fencehttp.WithLockName("x")}},
		{"no lock name", store, nil},
		{"empty lock name", store, []fencehttp.Option{fencehttp.WithLockName("")}},
		{"nil name func", store, []fencehttp.Option{fencehttp.WithLockNameFunc(nil)}},
		{"two names", store, []fencehttp.Option{fencehttp.WithLockName("a"), fencehttp.WithLockName("b")}},
		{"nil option", store, []fencehttp.Option{fencehttp.WithLockName("x"), nil}},
		{"empty method", store, []fencehttp.Option{fencehttp.WithLockName("x"), fencehttp.WithUncheckedMethods("")}},
	}
	for _, tc := range cases {
		_, err := fencehttp.NewMiddleware(tc.store, tc.opts...)
		if !errors.Is(err, fence.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", tc.name, err)
			continue
		}
		if strings.Count(err.Error(), "fencehttp:") != 1 || strings.Count(err.Error(), "fence:") != 1 {
			t.Errorf("%s: %q names a package more than once", tc.name, err)
		}
	}
	if _, err := fencestore.NewEtcdStore(nil, "p/"); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("NewEtcdStore(nil): %v", err)
	}
	if _, err := fencestore.NewEtcdStore(etcd.Client(t), ""); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("NewEtcdStore with no prefix: %v", err)
	}
}

// With the check left to the handler, a stale token still gets its 409,
// from the handler's own fenced transaction, and bad headers still get a
// 400 from the middleware.
func TestCheckInHandler(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	store, err := fencestore.NewEtcdStore(cli, etcdproc.Name(t, "records")+"/", fencestore.WithoutVerifier()) // fixed tokens: verification has its own tests
	if err != nil {
		t.Fatal(err)
	}
	data := etcdproc.Name(t, "object")
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := fencehttp.ClaimFrom(r.Context())
		body, _ := io.ReadAll(r.Body)
		if _, err := fence.NewTxn(r.Context(), cli, store.Guard(c)).Then(clientv3.OpPut(data, string(body))).Commit(); err != nil {
			fencehttp.WriteError(w, c, err)
		}
	})
	srv := serve(t, store, h, fencehttp.WithLockName("obj"), fencehttp.WithCheckInHandler())
	if resp := put(t, srv.URL, &fencestore.Claim{Name: "obj", Token: 9}, "nine"); resp.StatusCode != http.StatusOK {
		t.Fatalf("token 9: %d", resp.StatusCode)
	}
	if resp := put(t, srv.URL, &fencestore.Claim{Name: "obj", Token: 8}, "eight"); resp.StatusCode != http.StatusConflict {
		t.Errorf("token 8 after 9: %d, want 409", resp.StatusCode)
	}
	if resp := put(t, srv.URL, nil, "none"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("no headers: %d, want 400", resp.StatusCode)
	}
	if got := value(t, cli, data); got != "nine" {
		t.Errorf("object is %q", got)
	}
}

func value(t *testing.T, cli *clientv3.Client, key string) string {
	t.Helper()
	resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("reading %s: %v %v", key, resp, err)
	}
	return string(resp.Kvs[0].Value)
}
