package fencehttp_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencehttp"
	"github.com/leasefence/leasefence/fence/fencestore"
	"github.com/leasefence/leasefence/lease"
)

// The server side: every write to the object store must carry a token of
// the lock "objects/writer". The middleware refuses bad headers; the check
// against the highest token, recorded in etcd, is made by the handler's own
// write, in the same etcd transaction (WithCheckInHandler).
func ExampleMiddleware() {
	var cli *clientv3.Client // from clientv3.New
	store, err := fencestore.NewEtcdStore(cli, "fences/objects/")
	if err != nil {
		log.Fatal(err)
	}
	mw, err := fencehttp.NewMiddleware(store, fencehttp.WithLockName("objects/writer"), fencehttp.WithCheckInHandler())
	if err != nil {
		log.Fatal(err)
	}
	write := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := fencehttp.ClaimFrom(r.Context())
		body, _ := io.ReadAll(r.Body)
		_, err := fence.NewTxn(r.Context(), cli, store.Guard(c)).
			Then(clientv3.OpPut("objects"+r.URL.Path, string(body))).
			Commit()
		if err != nil {
			fencehttp.WriteError(w, c, err) // 409 if a newer token wrote first
		}
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mw.Wrap(write)))
}

// A service whose state lives in its own memory, not in etcd, still asks
// etcd whether a new token is the lock holder's before it accepts it: a
// wrong number is answered 403 and raises nothing, where it would
// otherwise lock every later holder out.
func ExampleWithVerifier() {
	var cli *clientv3.Client // a client of the etcd that holds the locks
	v, err := fencestore.NewEtcdVerifier(cli)
	if err != nil {
		log.Fatal(err)
	}
	store := fencestore.NewMemoryStore()
	mw, err := fencehttp.NewMiddleware(store, fencehttp.WithLockName("reports/daily"), fencehttp.WithVerifier(v))
	if err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex
	var report []byte
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /", func(w http.ResponseWriter, r *http.Request) {
		c, _ := fencehttp.ClaimFrom(r.Context())
		body, _ := io.ReadAll(r.Body)
		err := store.Do(r.Context(), c, func() error { // the token checked again, atomically with the write
			mu.Lock()
			defer mu.Unlock()
			report = body
			return nil
		})
		if err != nil {
			fencehttp.WriteError(w, c, err)
		}
	})
	mux.HandleFunc("GET /", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Write(report)
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mw.Wrap(mux)))
}

// The client side: requests made under a lock carry its name and token.
func ExampleTransport() {
	ctx := context.Background()
	var s *lease.Session // from lease.NewSession
	l, err := s.Lock(ctx, "objects/writer")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Unlock(ctx)
	client := &http.Client{Transport: &fencehttp.Transport{Holder: l}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, "http://127.0.0.1:8080/report.csv", strings.NewReader("a,b\n"))
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	if err := fencehttp.CheckResponse(resp); err != nil {
		log.Printf("refused: %v", err) // a *fence.StaleError: a newer holder wrote first
	}
}

// fixedHolder is a lock holding with a fixed token, standing in for a
// *lease.Lock where no etcd runs.
type fixedHolder struct {
	name  string
	token int64
}

func (h fixedHolder) Name() string { return h.name }
func (h fixedHolder) Key() string  { return h.name }
func (h fixedHolder) Token() int64 { return h.token }

// A new holder claims before it reads. A (token 3) wrote version 1 and has
// a second write still in the network when B (token 6) takes the lock. B's
// GET carries a claim, so the middleware records token 6 before the read
// runs, and A's late write, arriving after B's read, is refused: B's read
// is still the current state when B writes.
func ExampleAttachClaim() {
	var (
		mu     sync.Mutex
		report string
	)
	files := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.Method == http.MethodGet {
			fmt.Fprint(w, report)
			return
		}
		body, _ := io.ReadAll(r.Body)
		report = string(body)
	})
	mw, err := fencehttp.NewMiddleware(fencestore.NewMemoryStore(), fencehttp.WithLockName("reports/writer"))
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(mw.Wrap(files))
	defer srv.Close()

	send := func(method, body string, attach func(*http.Request, fence.Holder) error, h fence.Holder) (*http.Response, string) {
		req, _ := http.NewRequest(method, srv.URL+"/report.csv", strings.NewReader(body))
		if err := attach(req, h); err != nil {
			log.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		return resp, string(got)
	}
	a := fixedHolder{name: "reports/writer", token: 3}
	b := fixedHolder{name: "reports/writer", token: 6}

	send(http.MethodPut, "version 1", fencehttp.Attach, a)
	_, read := send(http.MethodGet, "", fencehttp.AttachClaim, b) // claim, then read
	fmt.Printf("B claims and reads %q\n", read)

	late, _ := send(http.MethodPut, "version 2", fencehttp.Attach, a) // A's late write
	fmt.Println("A's late write:", late.Status)
	fmt.Println(fencehttp.CheckResponse(late))

	send(http.MethodPut, read+", then B", fencehttp.Attach, b)
	_, read = send(http.MethodGet, "", fencehttp.Attach, b)
	fmt.Printf("report: %q\n", read)
	// Output:
	// B claims and reads "version 1"
	// A's late write: 409 Conflict
	// fence: stale token 3 at "reports/writer": token 6 already accepted
	// report: "version 1, then B"
}
