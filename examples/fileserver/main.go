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
	"go.etcd.io/etcd/pkg/v3/proxy"

	"github.com/leasefence/leasefence/examples/internal/exampleetcd"
	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencehttp"
	"github.com/leasefence/leasefence/fence/fencestore"
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
	store  *fencestore.EtcdStore
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
	cli, closeAll, err := exampleetcd.Connect(ctx, endpoints, out)
	if err != nil {
		return res, err
	}
	defer closeAll()
	sc := &scene{ctx: ctx, cli: cli, ttl: ttl, tl: exampleenv.NewTimeline(out),
		prefix: fmt.Sprintf("fileserver-%x/", time.Now().UnixNano()&0xffffff)}
	sc.lockName = sc.prefix + "writer"
	defer sc.closers.Run()
	if err := sc.startServer(); err != nil {
		return res, err
	}
	if err := sc.startA(&res); err != nil {
		return res, err
	}
	late, err := sc.sendStuckWrite()
	if err != nil {
		return res, err
	}
	sc.cutA()
	if err := sc.writeB(&res); err != nil {
		return res, err
	}
	if err := sc.heal(late, &res); err != nil {
		return res, err
	}
	if res.object, err = sc.readObject(); err != nil {
		return res, err
	}
	if !res.refused || res.object != "B's report" {
		return res, errors.New("stale write of A was not refused")
	}
	return res, nil
}

// scene is the story's cast: the object server behind the middleware, and
// client A, whose links to the server and to etcd go through fault proxies.
type scene struct {
	ctx      context.Context
	cli      *clientv3.Client
	ttl      time.Duration
	tl       *exampleenv.Timeline
	prefix   string
	lockName string
	base     string // the server's URL
	closers  exampleenv.Cleanup

	httpProxy proxy.Server
	httpURL   string // the server's URL through A's proxy
	etcdProxy proxy.Server
	la        *lease.Lock
	clientA   *http.Client
}

// answer is what a PUT got back.
type answer struct {
	status int
	body   string
	err    error
}

// startServer serves the object store on loopback, its writes fenced by
// the writer lock's tokens, recorded in etcd.
func (sc *scene) startServer() error {
	store, err := fencestore.NewEtcdStore(sc.cli, sc.prefix+"fences/")
	if err != nil {
		return err
	}
	mw, err := fencehttp.NewMiddleware(store, fencehttp.WithLockName(sc.lockName))
	if err != nil {
		return err
	}
	srv := &objectServer{cli: sc.cli, store: store, prefix: sc.prefix}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: mw.Wrap(srv.routes()), ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(ln)
	sc.closers.Add(func() { hs.Shutdown(context.Background()) })
	sc.base = "http://" + ln.Addr().String()
	sc.tl.Printf("server", "object store on %s, writes fenced by lock %q", sc.base, sc.lockName)
	return nil
}

// startA connects A through its proxies, takes the lock and writes
// version 1.
func (sc *scene) startA(res *outcome) error {
	httpProxy, httpURL, err := exampleetcd.NewProxy(sc.base)
	if err != nil {
		return err
	}
	sc.closers.Add(func() { httpProxy.Close() })
	etcdProxy, cliA, closeA, err := exampleetcd.ProxiedClient(sc.cli.Endpoints()[0])
	if err != nil {
		return err
	}
	sc.closers.Add(closeA)
	sc.httpProxy, sc.httpURL, sc.etcdProxy = httpProxy, httpURL, etcdProxy

	sa, err := lease.NewSession(sc.ctx, cliA, lease.WithTTL(sc.ttl))
	if err != nil {
		return err
	}
	sc.closers.Add(func() { sa.Close() })
	if sc.la, err = sa.Lock(sc.ctx, sc.lockName); err != nil {
		return err
	}
	res.aToken = sc.la.Token()
	sc.tl.Printf("A", "takes the writer lock: token %d", sc.la.Token())
	sc.clientA = &http.Client{Transport: &fencehttp.Transport{Holder: sc.la, Base: &http.Transport{}}}
	sc.closers.Add(sc.clientA.CloseIdleConnections) // before the proxy closes: it waits for them
	if status, _, err := putObject(sc.ctx, sc.clientA, sc.httpURL, "report.csv", "A's report, version 1", nil); err != nil || status != http.StatusNoContent {
		return fmt.Errorf("first write of A: %d %v", status, err)
	}
	sc.tl.Printf("A", "PUT report.csv (version 1): accepted")
	return nil
}

// sendStuckWrite sends A's version 2 into a paused link: it has left A
// (the Transport checks the lock before it sends) but not reached the
// server.
func (sc *scene) sendStuckWrite() (<-chan answer, error) {
	sc.httpProxy.PauseTx()
	late, sent := make(chan answer, 1), make(chan struct{})
	go func() {
		status, body, err := putObject(sc.ctx, sc.clientA, sc.httpURL, "report.csv", "A's report, version 2", sent)
		late <- answer{status, body, err}
	}()
	select {
	case <-sent:
	case a := <-late:
		return nil, fmt.Errorf("second write of A returned early: %d %v", a.status, a.err)
	}
	sc.tl.Printf("A", "PUT report.csv (version 2), token %d: sent, and stuck in the network", sc.la.Token())
	return late, nil
}

// cutA cuts A from etcd too, until A's lock is lost.
func (sc *scene) cutA() {
	sc.etcdProxy.BlackholeTx()
	sc.etcdProxy.BlackholeRx()
	sc.tl.Printf("net", "A's connection to etcd fails as well")
	<-sc.la.Done()
	sc.tl.Printf("A", "lock lost: %v", sc.la.Err())
}

// writeB takes the lock for B and writes B's report directly.
func (sc *scene) writeB(res *outcome) error {
	sb, err := lease.NewSession(sc.ctx, sc.cli, lease.WithTTL(sc.ttl))
	if err != nil {
		return err
	}
	sc.closers.Add(func() { sb.Close() })
	lb, err := sb.Lock(sc.ctx, sc.lockName)
	if err != nil {
		return err
	}
	sc.closers.Add(func() { lb.Unlock(sc.ctx) })
	res.bToken = lb.Token()
	sc.tl.Printf("B", "takes the writer lock: token %d", lb.Token())
	clientB := &http.Client{Transport: &fencehttp.Transport{Holder: lb}}
	if status, _, err := putObject(sc.ctx, clientB, sc.base, "report.csv", "B's report", nil); err != nil || status != http.StatusNoContent {
		return fmt.Errorf("write of B: %d %v", status, err)
	}
	sc.tl.Printf("B", "PUT report.csv: accepted")
	return nil
}

// heal lets A's delayed request through and records the server's answer.
func (sc *scene) heal(late <-chan answer, res *outcome) error {
	sc.etcdProxy.UnblackholeTx()
	sc.etcdProxy.UnblackholeRx()
	sc.httpProxy.UnpauseTx()
	sc.tl.Printf("net", "the network heals: A's delayed request reaches the server")
	a := <-late
	if a.err != nil {
		return fmt.Errorf("delayed write of A: %w", a.err)
	}
	res.status = a.status
	res.refused = a.status == http.StatusConflict
	if res.refused {
		sc.tl.Printf("server", "answers A: 409 Conflict: %s", a.body)
	} else {
		sc.tl.Printf("server", "answers A: %d: the stale write was ACCEPTED", a.status)
	}
	return nil
}

// readObject reads the report back.
func (sc *scene) readObject() (string, error) {
	obj, err := http.Get(sc.base + "/objects/report.csv")
	if err != nil {
		return "", err
	}
	defer obj.Body.Close()
	body, err := io.ReadAll(obj.Body)
	if err != nil {
		return "", err
	}
	sc.tl.Printf("server", "report.csv is %q", string(body))
	return string(body), nil
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
