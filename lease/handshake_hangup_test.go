package lease_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// tlsFront is a TLS endpoint in front of the package's etcd: while down it
// accepts connections and closes them before any handshake, as an etcd
// member that is going down, or a TCP load balancer with no backend up,
// does; once up it terminates TLS and carries the bytes to etcd.
type tlsFront struct {
	ln      net.Listener
	cfg     *tls.Config
	target  string
	up      chan struct{} // closed by bringUp
	dropped chan struct{} // receives one value per connection dropped while down
	wg      sync.WaitGroup
}

func newTLSFront(t *testing.T, certFile, keyFile, target string) *tlsFront {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &tlsFront{ln: ln, cfg: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}}, target: target,
		up: make(chan struct{}), dropped: make(chan struct{}, 1024)}
	f.wg.Add(1)
	go f.serve()
	t.Cleanup(func() {
		ln.Close()
		f.wg.Wait()
	})
	return f
}

func (f *tlsFront) bringUp() { close(f.up) }

func (f *tlsFront) serve() {
	defer f.wg.Done()
	var conns sync.WaitGroup
	defer conns.Wait()
	var mu sync.Mutex
	var open []net.Conn
	defer func() {
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
	}()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		select {
		case <-f.up:
		default:
			c.Close()
			select {
			case f.dropped <- struct{}{}:
			default:
			}
			continue
		}
		back, err := net.Dial("tcp", f.target)
		if err != nil {
			c.Close()
			continue
		}
		front := tls.Server(c, f.cfg)
		mu.Lock()
		open = append(open, front, back)
		mu.Unlock()
		conns.Add(2)
		go func() { defer conns.Done(); io.Copy(back, front); back.Close() }()
		go func() { defer conns.Done(); io.Copy(front, back); front.Close() }()
	}
}

// A TLS endpoint that hangs up before the handshake (a member going down,
// a load balancer with no backend up) is a failure of the network, not of
// a certificate: Run must keep trying, and take the lock once the endpoint
// serves again, instead of ending with ErrTLSHandshake.
func TestRunRetriesHandshakeHangUp(t *testing.T) {
	etcdproc.LeakCheck(t)
	certs, err := etcdproc.GenerateCerts(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	target := strings.TrimPrefix(strings.TrimPrefix(etcd.Endpoints()[0], "http://"), "https://")
	f := newTLSFront(t, certs.Server.CertFile, certs.Server.KeyFile, target)
	trusted := x509.NewCertPool()
	if pem, err := os.ReadFile(certs.CAFile); err != nil || !trusted.AppendCertsFromPEM(pem) {
		t.Fatal("reading the CA")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{f.ln.Addr().String()},
		TLS: &tls.Config{RootCAs: trusted}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	took := make(chan int64, 1)
	ran := make(chan error, 1)
	go func() {
		ran <- lease.Run(ctx, cli, etcdproc.Name(t, "tls-hangup"), func(ctx context.Context, l *lease.Lock) error {
			took <- l.Token()
			return nil
		}, lease.WithTTL(shortTTL))
	}()
	// Let the endpoint drop a few handshakes, then serve.
	for i := 0; i < 3; i++ {
		select {
		case <-f.dropped:
		case err := <-ran:
			t.Fatalf("Run ended while the endpoint was down: %v", err)
		case <-ctx.Done():
			t.Fatal("no connection attempt reached the endpoint")
		}
	}
	f.bringUp()
	select {
	case <-took:
	case err := <-ran:
		if errors.Is(err, lease.ErrTLSHandshake) {
			t.Fatalf("Run gave up on a hang-up as on a certificate failure: %v", err)
		}
		t.Fatalf("Run ended before taking the lock: %v", err)
	case <-ctx.Done():
		t.Fatal("Run never took the lock once the endpoint served")
	}
	if err := <-ran; err != nil {
		t.Fatalf("Run = %v", err)
	}
}
