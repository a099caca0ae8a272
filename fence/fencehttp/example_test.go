package fencehttp_test

import (
	"context"
	"io"
	"log"
	"net/http"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencehttp"
	"github.com/leasefence/leasefence/lease"
)

// The server side: every write to the object store must carry a token of
// the lock "objects/writer". The middleware refuses bad headers; the check
// against the highest token, recorded in etcd, is made by the handler's own
// write, in the same etcd transaction (WithCheckInHandler).
func ExampleMiddleware() {
	var cli *clientv3.Client // from clientv3.New
	store, err := fencehttp.NewEtcdStore(cli, "fences/objects/")
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
