package lease_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

func probe(t *testing.T, h http.Handler) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	return rec.Code, rec.Body.String()
}

func TestHealth(t *testing.T) {
	etcdproc.LeakCheck(t)
	if _, err := lease.NewHealth(0); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Fatalf("NewHealth(0): %v", err)
	}
	cli := etcd.Client(t)
	h, err := lease.NewHealth(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := probe(t, h); code != http.StatusOK {
		t.Fatalf("nothing tracked: %d", code)
	}

	// Held and renewed: healthy.
	name := etcdproc.Name(t, "health")
	l := mustLock(t, newSession(t, cli), name)
	h.Track(l)
	if err := h.Check(); err != nil {
		t.Fatalf("held: %v", err)
	}

	// Renewals stop reaching etcd: unhealthy past the margin, before the
	// lease is lost.
	p, viaProxy, _ := etcdproc.ProxiedClient(t, etcd.Endpoints()[0])
	s2 := newSession(t, viaProxy, lease.WithTTL(5*time.Second))
	l2 := mustLock(t, s2, name+"-2")
	h.Track(l2)
	p.BlackholeTx()
	p.BlackholeRx()
	deadline := time.Now().Add(5 * time.Second)
	for h.Check() == nil && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond) // polling a check, as a prober does
	}
	err = h.Check()
	if err == nil || !strings.Contains(err.Error(), "not renewed") || l2.Err() != nil {
		t.Fatalf("silent session: %v (lock err %v), want a renewal failure while still held", err, l2.Err())
	}
	if code, body := probe(t, h); code != http.StatusServiceUnavailable || !strings.Contains(body, name+"-2") {
		t.Fatalf("probe: %d %q", code, body)
	}
	p.UnblackholeTx()
	p.UnblackholeRx()
	h.Forget(name + "-2")

	// Lost: unhealthy until a new holding is tracked.
	if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), l.Key()); err != nil {
		t.Fatal(err)
	}
	<-l.Done()
	if err := h.Check(); err == nil || !strings.Contains(err.Error(), "lost") {
		t.Fatalf("lost: %v", err)
	}
	again := mustLock(t, newSession(t, cli), name)
	h.Track(again)
	if err := h.Check(); err != nil {
		t.Fatalf("tracked anew: %v", err)
	}
	// Released: forgotten, healthy.
	if err := again.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if code, _ := probe(t, h); code != http.StatusOK {
		t.Fatalf("released: %d", code)
	}
}
