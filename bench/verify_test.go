package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence/fencehttp"
	"github.com/leasefence/leasefence/fence/fencestore"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// verifiedFence is one HTTP fence of BenchmarkVerifiedFence: a middleware
// over a store, served on loopback, with a handler that writes nothing, so
// that what is measured is the fence.
type verifiedFence struct {
	name string
	srv  *httptest.Server
}

// verifiedFences are the fences compared: an EtcdStore and a MemoryStore,
// each without and with verification, in that order (ratios are to the
// first).
func verifiedFences(b *testing.B, cli *clientv3.Client, lockName string) []verifiedFence {
	b.Helper()
	v, err := fencestore.NewEtcdVerifier(cli)
	if err != nil {
		b.Fatal(err)
	}
	plainEtcd, err := fencestore.NewEtcdStore(cli, etcdproc.Name(b, "plain-records")+"/", fencestore.WithoutVerifier())
	if err != nil {
		b.Fatal(err)
	}
	verifiedEtcd, err := fencestore.NewEtcdStore(cli, etcdproc.Name(b, "verified-records")+"/")
	if err != nil {
		b.Fatal(err)
	}
	noop := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	fences := []struct {
		name  string
		store fencestore.Store
		opts  []fencehttp.Option
	}{
		{"etcdstore", plainEtcd, nil},
		{"etcdstore-verified", verifiedEtcd, nil},
		{"memorystore", fencestore.NewMemoryStore(), nil},
		{"memorystore-verified", fencestore.NewMemoryStore(), []fencehttp.Option{fencehttp.WithVerifier(v)}},
	}
	var out []verifiedFence
	for _, f := range fences {
		mw, err := fencehttp.NewMiddleware(f.store, append(f.opts, fencehttp.WithLockName(lockName))...)
		if err != nil {
			b.Fatal(err)
		}
		srv := httptest.NewServer(mw.Wrap(noop))
		b.Cleanup(srv.Close)
		out = append(out, verifiedFence{f.name, srv})
	}
	return out
}

// fencedPut sends one PUT with token to srv and wants 204.
func fencedPut(srv *httptest.Server, lockName string, token int64) error {
	req, err := http.NewRequest(http.MethodPut, srv.URL, strings.NewReader("v"))
	if err != nil {
		return err
	}
	fencehttp.SetHeaders(req.Header, fencestore.Claim{Name: lockName, Token: token})
	resp, err := srv.Client().Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// BenchmarkVerifiedFence measures what verifying tokens costs an HTTP
// fence, against the same fence without it, in one run: the steady state
// (a holder's requests after its first, interleaved) and a holding's first
// request (each iteration takes a new holding of the lock, untimed, then
// times its first request through each fence in turn). Ratios are to the
// unverified EtcdStore.
func BenchmarkVerifiedFence(b *testing.B) {
	for _, fs := range fsyncModes {
		b.Run("fsync="+fs.name+"/request=steady", func(b *testing.B) {
			cli := newClient(b, cluster(b, 1, fs.off).Endpoints()[0], &requests{})
			name := etcdproc.Name(b, "verified")
			l := heldLock(b, cli, name)
			var turns []turn
			for _, f := range verifiedFences(b, cli, name) {
				op := func() error { return fencedPut(f.srv, name, l.Token()) }
				if err := op(); err != nil { // the holding's first request, untimed
					b.Fatalf("%s: %v", f.name, err)
				}
				turns = append(turns, turn{f.name, op})
			}
			interleave(b, turns)
		})
		b.Run("fsync="+fs.name+"/request=first", func(b *testing.B) {
			cli := newClient(b, cluster(b, 1, fs.off).Endpoints()[0], &requests{})
			benchFirstRequests(b, cli)
		})
	}
}

// benchFirstRequests times the first request of a new holding through each
// fence, taking the holdings untimed, and reports medians as interleave
// does.
func benchFirstRequests(b *testing.B, cli *clientv3.Client) {
	ctx := context.Background()
	s, err := lease.NewSession(ctx, cli)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	name := etcdproc.Name(b, "first")
	fences := verifiedFences(b, cli, name)
	lat := make([][]time.Duration, len(fences))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range fences {
			k := (i + j) % len(fences)
			b.StopTimer()
			l, err := s.Lock(ctx, name)
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			start := time.Now()
			if err := fencedPut(fences[k].srv, name, l.Token()); err != nil {
				b.Fatalf("%s: %v", fences[k].name, err)
			}
			lat[k] = append(lat[k], time.Since(start))
			b.StopTimer()
			if err := l.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	b.StopTimer()
	names := make([]string, len(fences))
	for k, f := range fences {
		names[k] = f.name
	}
	reportMedians(b, names, lat)
}
