package fencehttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencehttp"
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

func etcdVerifier(t *testing.T, cli *clientv3.Client, opts ...fencestore.VerifierOption) *fencestore.EtcdVerifier {
	t.Helper()
	v, err := fencestore.NewEtcdVerifier(cli, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// verifiedFences are the two ways a fence verifies: a MemoryStore given a
// verifier by the middleware, and an EtcdStore by default.
func verifiedFences(t *testing.T, cli *clientv3.Client, cv *countingVerifier) map[string]func(name string) (fencestore.Store, []fencehttp.Option, func() int64) {
	return map[string]func(string) (fencestore.Store, []fencehttp.Option, func() int64){
		"memory": func(name string) (fencestore.Store, []fencehttp.Option, func() int64) {
			s := fencestore.NewMemoryStore()
			return s, []fencehttp.Option{fencehttp.WithVerifier(cv)}, func() int64 { return s.Highest(name) }
		},
		"etcd": func(name string) (fencestore.Store, []fencehttp.Option, func() int64) {
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
	}
}

// wantForbidden checks a 403 refusal of token as no live holding of name:
// its headers, its body, and CheckResponse's error.
func wantForbidden(t *testing.T, resp *http.Response, body, name string, token int64) {
	t.Helper()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("token %d: status %d (%s), want 403", token, resp.StatusCode, body)
	}
	var ue *fence.UnverifiedError
	if err := fencehttp.CheckResponse(resp); !errors.As(err, &ue) || ue.Name != name || ue.Token != token || ue.Revision <= 0 {
		t.Fatalf("CheckResponse = %v, want token %d of %q unverified", err, token, name)
	}
	var got struct {
		Error    string `json:"error"`
		Revision int64  `json:"revision"`
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil || got.Revision != ue.Revision || got.Error == "" {
		t.Fatalf("body %q: %v", body, err)
	}
}

// A forged token, a revision that created no lock key, a released
// holding's token, a waiter's token and a forged claim are refused with
// 403 and raise nothing; the real holder's next request passes, and the
// waiter's once it holds. A holding costs the fence one read.
func TestVerifiedFence(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	cv := &countingVerifier{Verifier: etcdVerifier(t, cli)}
	for kind, mk := range verifiedFences(t, cli, cv) {
		t.Run(kind, func(t *testing.T) {
			ctx := etcdproc.Ctx(t, 30*time.Second)
			name := etcdproc.Name(t, "jobs/compact")
			store, opts, highest := mk(name)
			var reg register
			srv := serve(t, store, reg.handler(), append(opts, fencehttp.WithLockName(name))...)
			s1, s2 := newSession(t, cli), newSession(t, cli)
			l1, err := s1.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			reads := cv.reads.Load()
			for i := 0; i < 5; i++ {
				if resp, body := send(t, http.MethodPut, srv.URL, "one", fencehttp.Attach, l1); resp.StatusCode != http.StatusOK {
					t.Fatalf("holder's PUT %d: %d %s", i, resp.StatusCode, body)
				}
			}
			if n := cv.reads.Load() - reads; n != 1 {
				t.Fatalf("%d verifier reads for one holding's 5 requests, want 1", n)
			}

			other, err := cli.Put(ctx, name+"-data", "x") // created no key of the lock
			if err != nil {
				t.Fatal(err)
			}
			for _, tok := range []int64{forged, other.Header.Revision} {
				resp, body := send(t, http.MethodPut, srv.URL, "forged", fencehttp.Attach, fixedHolder{name, tok})
				wantForbidden(t, resp, body, name, tok)
				resp, body = send(t, http.MethodGet, srv.URL, "", fencehttp.AttachClaim, fixedHolder{name, tok})
				wantForbidden(t, resp, body, name, tok)
			}
			if h := highest(); h != l1.Token() {
				t.Fatalf("highest %d after forged tokens, want the holder's %d", h, l1.Token())
			}
			if resp, body := send(t, http.MethodPut, srv.URL, "two", fencehttp.Attach, l1); resp.StatusCode != http.StatusOK {
				t.Fatalf("holder after forged tokens: %d %s", resp.StatusCode, body)
			}

			// A holding released before its first request: key gone.
			if err := l1.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			l2, err := s1.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if err := l2.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			resp, body := send(t, http.MethodPut, srv.URL, "released", fencehttp.Attach, fixedHolder{name, l2.Token()}) // as a paused client would send it
			wantForbidden(t, resp, body, name, l2.Token())

			// A waiter's token is refused until its turn: it cannot fence
			// the holder out early.
			l3, err := s1.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			granted := make(chan *lease.Lock, 1)
			go func() {
				l, _ := s2.Lock(ctx, name)
				granted <- l
			}()
			waiter := waiterToken(t, cli, name, s2)
			resp, body = send(t, http.MethodPut, srv.URL, "waiter", fencehttp.Attach, fixedHolder{name, waiter})
			wantForbidden(t, resp, body, name, waiter)
			if resp, _ := send(t, http.MethodPut, srv.URL, "three", fencehttp.Attach, l3); resp.StatusCode != http.StatusOK {
				t.Fatalf("holder after its waiter's request: %d, want 200", resp.StatusCode)
			}
			if err := l3.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			l4 := <-granted
			if l4 == nil || l4.Token() != waiter {
				t.Fatalf("waiter not granted: %v", l4)
			}
			if resp, body := send(t, http.MethodPut, srv.URL, "four", fencehttp.Attach, l4); resp.StatusCode != http.StatusOK {
				t.Fatalf("the waiter, granted: %d %s", resp.StatusCode, body)
			}
			if v, writes := reg.get(); v != "four" || writes != 8 {
				t.Fatalf("resource %q after %d writes, want four after 8", v, writes)
			}
		})
	}
}

// waiterToken is the creation revision of the key session s queued under
// name: a waiter's token, which no Lock call has returned yet.
func waiterToken(t *testing.T, cli *clientv3.Client, name string, s *lease.Session) int64 {
	t.Helper()
	key := fmt.Sprintf("%s/%x", name, int64(s.Lease()))
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		resp, err := cli.Get(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 1 {
			return resp.Kvs[0].CreateRevision
		}
		time.Sleep(10 * time.Millisecond) // polling etcd for the waiter's put, bounded by the deadline
	}
	t.Fatalf("no key %s", key)
	return 0
}

// A verifier that cannot reach etcd: the request is refused as unknown
// (503), never let through, and the store is unchanged.
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
	store := fencestore.NewMemoryStore()
	var reg register
	srv := serve(t, store, reg.handler(), fencehttp.WithLockName("jobs"),
		fencehttp.WithVerifier(etcdVerifier(t, dead, fencestore.WithReadTimeout(300*time.Millisecond))))
	for _, attach := range []func(*http.Request, fence.Holder) error{fencehttp.Attach, fencehttp.AttachClaim} {
		resp, body := send(t, http.MethodPut, srv.URL, "x", attach, fixedHolder{"jobs", 42})
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("status %d (%s), want 503", resp.StatusCode, body)
		}
	}
	if _, writes := reg.get(); writes != 0 || store.Highest("jobs") != 0 {
		t.Fatalf("%d writes, highest %d, want none", writes, store.Highest("jobs"))
	}
}

// A verifier for a store that verifies itself is a plausible mistake (two
// verifiers, one unused): refused.
func TestVerifierOnEtcdStoreRefused(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	store, err := fencestore.NewEtcdStore(cli, "records/")
	if err != nil {
		t.Fatal(err)
	}
	_, err = fencehttp.NewMiddleware(store, fencehttp.WithLockName("jobs"), fencehttp.WithVerifier(etcdVerifier(t, cli)))
	if !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("NewMiddleware: %v", err)
	}
	if _, err := fencehttp.NewMiddleware(fencestore.NewMemoryStore(), fencehttp.WithLockName("jobs"), fencehttp.WithVerifier(nil)); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("WithVerifier(nil): %v", err)
	}
}
