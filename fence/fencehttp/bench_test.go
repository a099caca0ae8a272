package fencehttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencehttp"
	"github.com/leasefence/leasefence/fence/fencestore"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// BenchmarkPUT is one HTTP PUT that writes an etcd key: plain; behind the
// middleware with the memory store; behind the middleware with the etcd
// store, which checks, and the handler's write in a transaction that checks
// again; and with the check left to that transaction alone
// (WithCheckInHandler). All in the same run.
func BenchmarkPUT(b *testing.B) {
	cli := etcd.Client(b)
	key := etcdproc.Name(b, "bench-object")
	// A fixed token: what verifying costs is bench/verify_test.go's.
	store, err := fencestore.NewEtcdStore(cli, etcdproc.Name(b, "bench-records")+"/", fencestore.WithoutVerifier())
	if err != nil {
		b.Fatal(err)
	}
	plain := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if _, err := cli.Put(r.Context(), key, string(body)); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	})
	fenced := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := fencehttp.ClaimFrom(r.Context())
		body, _ := io.ReadAll(r.Body)
		if _, err := fence.NewTxn(r.Context(), cli, store.Guard(c)).Then(clientv3.OpPut(key, string(body))).Commit(); err != nil {
			fencehttp.WriteError(w, c, err)
		}
	})
	mw := func(s fencestore.Store, h http.Handler, opts ...fencehttp.Option) http.Handler {
		m, err := fencehttp.NewMiddleware(s, append(opts, fencehttp.WithLockName("bench"))...)
		if err != nil {
			b.Fatal(err)
		}
		return m.Wrap(h)
	}
	cases := []struct {
		impl string
		h    http.Handler
	}{
		{"plain", plain},
		{"memorystore", mw(fencestore.NewMemoryStore(), plain)},
		{"etcdstore", mw(store, fenced)},
		{"etcdstore-in-handler", mw(store, fenced, fencehttp.WithCheckInHandler())},
	}
	for _, c := range cases {
		b.Run("impl="+c.impl, func(b *testing.B) {
			srv := httptest.NewServer(c.h)
			defer srv.Close()
			client := srv.Client()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				req, _ := http.NewRequest(http.MethodPut, srv.URL, strings.NewReader("v"))
				fencehttp.SetHeaders(req.Header, fencestore.Claim{Name: "bench", Token: 7})
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
		})
	}
}
