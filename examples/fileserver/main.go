// Command fileserver runs a small HTTP object store whose writes are
// fenced by the fence/fencehttp middleware, and two writers that hold the
// writer lock in turn.
//
// Writer A takes the lock and writes an object. Its next write is held up
// in the network (etcd's fault proxy pauses the bytes between A and the
// server) and, while it hangs there, A's connection to etcd fails too, so
// A's lease expires. Writer B takes the lock with a larger token and writes.
// Then A's delayed request arrives: the middleware answers 409, naming both
// tokens, and the object keeps B's content.
//
// With neither -endpoints nor ETCD_ENDPOINTS it starts an embedded etcd.
// The exit status is 0 only if A's late request was refused and the object
// is B's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencehttp"
	"github.com/leasefence/leasefence/internal/etcdtest"
	"github.com/leasefence/leasefence/internal/exampleenv"
	"github.com/leasefence/leasefence/lease"
)

func main() {
	endpoints := flag.String("endpoints", "", "etcd client URLs, comma-separated (default $ETCD_ENDPOINTS, else an embedded etcd)")
	ttl := flag.Duration("ttl", 2*time.Second, "lease TTL of the writers")
	flag.Parse()
	if _, err := run(*endpoints, *ttl, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fileserver:", err)
		os.Exit(1)
	}
}

// objectServer is the protected service: objects in etcd, each write made in
// the same etcd transaction as the fence check of its request's token.
type objectServer struct {
	cli    *clientv3.Client
	store  *fencehttp.EtcdStore
	prefix string
}

func (s *objectServer) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /objects/{name}", func(w http.ResponseWriter, r *http.Request) {
		resp, err := s.cli.Get(r.Context(), s.prefix+"objects/"+r.PathValue("name"))
		switch {
		case err != nil:
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		case len(resp.Kvs) == 0:
			http.NotFound(w, r)
		default:
			w.Write(resp.Kvs[0].Value)
		}
	})
	mux.HandleFunc("PUT /objects/{name}", func(w http.ResponseWriter, r *http.Request) {
		c, _ := fencehttp.ClaimFrom(r.Context())
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		_, err = fence.NewTxn(r.Context(), s.cli, s.store.Guard(c)).
			Then(clientv3.OpPut(s.prefix+"objects/"+r.PathValue("name"), string(body))).
			Commit()
		if err != nil {
			fencehttp.WriteError(w, c, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// outcome is what a run ended with.
type outcome struct {
	aToken, bToken int64
	refused        bool
	status         int
	object         string
}

func run(endpoints string, ttl time.Duration, out io.Writer) (outcome, error) {
	var res outcome
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli, closeAll, err := exampleenv.Connect(ctx, endpoints, out)
	if err != nil {
		return res, err
	}
	defer closeAll()
	tl := exampleenv.NewTimeline(out)
	prefix := fmt.Sprintf("fileserver-%x/", time.Now().UnixNano()&0xffffff)
	lockName := prefix + "writer"

	store, err := fencehttp.NewEtcdStore(cli, prefix+"fences/")
	if err != nil {
		return res, err
	}
	mw, err := fencehttp.NewMiddleware(store, fencehttp.WithLockName(lockName))
	if err != nil {
		return res, err
	}
	srv := &objectServer{cli: cli, store: store, prefix: prefix}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	hs := &http.Server{Handler: mw.Wrap(srv.routes()), ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(ln)
	defer hs.Shutdown(context.Background())
	base := "http://" + ln.Addr().String()
	tl.Printf("server", "object store on %s, writes fenced by lock %q", base, lockName)

	// A reaches both the server and etcd through fault proxies.
	httpProxy, httpURL, err := etcdtest.NewProxy("", base)
	if err != nil {
		return res, err
	}
	defer httpProxy.Close()
	etcdProxy, cliA, closeA, err := exampleenv.ProxiedClient(cli.Endpoints()[0])
	if err != nil {
		return res, err
	}
	defer closeA()

	sa, err := lease.NewSession(ctx, cliA, lease.WithTTL(ttl))
	if err != nil {
		return res, err
	}
	defer sa.Close()
	la, err := sa.Lock(ctx, lockName)
	if err != nil {
		return res, err
	}
	res.aToken = la.Token()
	tl.Printf("A", "takes the writer lock: token %d", la.Token())
	clientA := &http.Client{Transport: &fencehttp.Transport{Holder: la, Base: &http.Transport{}}}
	defer clientA.CloseIdleConnections() // before the proxy closes: it waits for them
	if status, _, err := putObject(ctx, clientA, httpURL, "report.csv", "A's report, version 1", nil); err != nil || status != http.StatusNoContent {
		return res, fmt.Errorf("first write of A: %d %v", status, err)
	}
	tl.Printf("A", "PUT report.csv (version 1): accepted")

	httpProxy.PauseTx()
	type answer struct {
		status int
		body   string
		err    error
	}
	late, sent := make(chan answer, 1), make(chan struct{})
	go func() {
		status, body, err := putObject(ctx, clientA, httpURL, "report.csv", "A's report, version 2", sent)
		late <- answer{status, body, err}
	}()
	// The request must have left A before A loses its lock: the Transport
	// checks the lock before it sends.
	select {
	case <-sent:
	case a := <-late:
		return res, fmt.Errorf("second write of A returned early: %d %v", a.status, a.err)
	}
	tl.Printf("A", "PUT report.csv (version 2), token %d: sent, and stuck in the network", la.Token())
	etcdProxy.BlackholeTx()
	etcdProxy.BlackholeRx()
	tl.Printf("net", "A's connection to etcd fails as well")
	<-la.Done()
	tl.Printf("A", "lock lost: %v", la.Err())

	sb, err := lease.NewSession(ctx, cli, lease.WithTTL(ttl))
	if err != nil {
		return res, err
	}
	defer sb.Close()
	lb, err := sb.Lock(ctx, lockName)
	if err != nil {
		return res, err
	}
	defer lb.Unlock(ctx)
	res.bToken = lb.Token()
	tl.Printf("B", "takes the writer lock: token %d", lb.Token())
	clientB := &http.Client{Transport: &fencehttp.Transport{Holder: lb}}
	if status, _, err := putObject(ctx, clientB, base, "report.csv", "B's report", nil); err != nil || status != http.StatusNoContent {
		return res, fmt.Errorf("write of B: %d %v", status, err)
	}
	tl.Printf("B", "PUT report.csv: accepted")

	etcdProxy.UnblackholeTx()
	etcdProxy.UnblackholeRx()
	httpProxy.UnpauseTx()
	tl.Printf("net", "the network heals: A's delayed request reaches the server")
	a := <-late
	if a.err != nil {
		return res, fmt.Errorf("delayed write of A: %w", a.err)
	}
	res.status = a.status
	res.refused = a.status == http.StatusConflict
	if res.refused {
		tl.Printf("server", "answers A: 409 Conflict: %s", a.body)
	} else {
		tl.Printf("server", "answers A: %d: the stale write was ACCEPTED", a.status)
	}

	obj, err := http.Get(base + "/objects/report.csv")
	if err != nil {
		return res, err
	}
	body, _ := io.ReadAll(obj.Body)
	obj.Body.Close()
	res.object = string(body)
	tl.Printf("server", "report.csv is %q", res.object)
	if !res.refused || res.object != "B's report" {
		return res, errors.New("stale write of A was not refused")
	}
	return res, nil
}

// putObject writes an object and returns the answer's status, and its body
// if the fence refused the write. sent, if not nil, is closed once the
// request has been written to the network.
func putObject(ctx context.Context, c *http.Client, base, name, content string, sent chan<- struct{}) (int, string, error) {
	if sent != nil {
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
			WroteRequest: func(httptrace.WroteRequestInfo) { close(sent) },
		})
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, base+"/objects/"+name, strings.NewReader(content))
	if err != nil {
		return 0, "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if stale := fencehttp.CheckResponse(resp); stale != nil {
		return resp.StatusCode, strings.TrimSpace(string(body)), nil
	}
	return resp.StatusCode, "", nil
}
