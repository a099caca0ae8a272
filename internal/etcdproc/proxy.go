package etcdproc

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/toolcache"
)

// proxyMain is the program that runs etcd's fault-injecting TCP proxy
// (go.etcd.io/etcd/pkg/v3/proxy) in a process of its own: the library's
// module cannot require etcd's pkg module, so its tests drive the proxy
// through this program's standard input, one command a line, each
// answered with "ok" once applied.
const proxyMain = `package main

import (
	"bufio"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/pkg/v3/proxy"
	"go.uber.org/zap"
)

func main() {
	p := proxy.NewServer(proxy.ServerConfig{
		Logger: zap.NewNop(),
		From:   url.URL{Scheme: "tcp", Host: os.Args[1]},
		To:     url.URL{Scheme: "tcp", Host: os.Args[2]},
	})
	select {
	case <-p.Ready():
	case err := <-p.Error():
		fmt.Println("error", err)
		os.Exit(1)
	case <-time.After(10 * time.Second):
		fmt.Println("error: not ready after 10s")
		os.Exit(1)
	}
	fmt.Println("ready")
	plain := map[string]func(){
		"blackhole-tx": p.BlackholeTx, "unblackhole-tx": p.UnblackholeTx,
		"blackhole-rx": p.BlackholeRx, "unblackhole-rx": p.UnblackholeRx,
		"pause-tx": p.PauseTx, "unpause-tx": p.UnpauseTx,
		"pause-rx": p.PauseRx, "unpause-rx": p.UnpauseRx,
		"undelay-tx": p.UndelayTx, "undelay-rx": p.UndelayRx,
	}
	delays := map[string]func(latency, rv time.Duration){"delay-tx": p.DelayTx, "delay-rx": p.DelayRx}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if err := apply(strings.Fields(in.Text()), plain, delays); err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Println("ok")
	}
	// Standard input closed: exit without the proxy's Close, which waits
	// for copy loops that an idle connection keeps blocked. The kernel
	// closes every connection.
	os.Exit(0)
}

// apply runs one command: a name alone, or a delay's name, latency and
// random variable ("delay-tx 10ms 2ms").
func apply(cmd []string, plain map[string]func(), delays map[string]func(latency, rv time.Duration)) error {
	if len(cmd) == 1 && plain[cmd[0]] != nil {
		plain[cmd[0]]()
		return nil
	}
	if len(cmd) != 3 || delays[cmd[0]] == nil {
		return fmt.Errorf("unknown command %q", cmd)
	}
	latency, err := time.ParseDuration(cmd[1])
	if err != nil {
		return err
	}
	rv, err := time.ParseDuration(cmd[2])
	if err != nil {
		return err
	}
	delays[cmd[0]](latency, rv)
	return nil
}
`

// proxyBinary builds the proxy program once per machine; a change to its
// source builds it anew.
func proxyBinary(ctx context.Context) (string, error) {
	return toolcache.Build(ctx, toolcache.Program{
		Name:     "etcd-fault-proxy",
		Version:  fmt.Sprintf("%s-%x", ServerVersion, sha256.Sum256([]byte(proxyMain)))[:len(ServerVersion)+9],
		Requires: []string{"go.etcd.io/etcd/pkg/v3@" + ServerVersion},
		Package:  ".",
		Files:    map[string]string{"main.go": proxyMain},
	})
}

// Proxy is etcd's fault-injecting TCP proxy, running as a child process in
// front of one member (or any TCP server). Its methods are those of etcd's
// proxy.Server that the tests use; a failure to apply one fails the test.
//
// It is the one proxy of the project's tests: the library's module cannot
// link etcd's proxy package, and the other modules' tests use this one too
// rather than a second, in-process copy. It is for faults on one client's
// connection (pause, delay, blackhole); for chosen messages held back use
// internal/holdback, for round trips precise enough to measure
// internal/chaos/rttlab, and for partitions between hosts
// internal/chaos/netlab.
type Proxy struct {
	tb     testing.TB
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	exited chan struct{}

	mu     sync.Mutex // one command at a time
	closed bool
}

// BlackholeTx drops what the proxy reads from its clients (toward etcd).
func (p *Proxy) BlackholeTx() { p.do("blackhole-tx") }

// UnblackholeTx ends BlackholeTx.
func (p *Proxy) UnblackholeTx() { p.do("unblackhole-tx") }

// BlackholeRx drops what the proxy reads from etcd (toward its clients).
func (p *Proxy) BlackholeRx() { p.do("blackhole-rx") }

// UnblackholeRx ends BlackholeRx.
func (p *Proxy) UnblackholeRx() { p.do("unblackhole-rx") }

// PauseTx holds back what its clients send, until UnpauseTx.
func (p *Proxy) PauseTx() { p.do("pause-tx") }

// UnpauseTx ends PauseTx.
func (p *Proxy) UnpauseTx() { p.do("unpause-tx") }

// PauseRx holds back what etcd answers, until UnpauseRx.
func (p *Proxy) PauseRx() { p.do("pause-rx") }

// UnpauseRx ends PauseRx.
func (p *Proxy) UnpauseRx() { p.do("unpause-rx") }

// DelayTx delays what its clients send by latency, give or take up to rv
// (a random variable, per read), until UndelayTx.
func (p *Proxy) DelayTx(latency, rv time.Duration) { p.do(fmt.Sprintf("delay-tx %v %v", latency, rv)) }

// UndelayTx ends DelayTx.
func (p *Proxy) UndelayTx() { p.do("undelay-tx") }

// DelayRx delays what etcd answers by latency, give or take up to rv,
// until UndelayRx.
func (p *Proxy) DelayRx(latency, rv time.Duration) { p.do(fmt.Sprintf("delay-rx %v %v", latency, rv)) }

// UndelayRx ends DelayRx.
func (p *Proxy) UndelayRx() { p.do("undelay-rx") }

func (p *Proxy) do(cmd string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		p.fail("etcdproc: proxy %s after Close", cmd)
		return
	}
	if _, err := fmt.Fprintln(p.in, cmd); err != nil {
		p.fail("etcdproc: proxy %s: %v", cmd, err)
		return
	}
	if !p.out.Scan() || p.out.Text() != "ok" {
		p.fail("etcdproc: proxy %s: answered %q (%v)", cmd, p.out.Text(), p.out.Err())
	}
}

// fail reports a command that was not applied: to the test, or, for a
// proxy started without one, by a panic.
func (p *Proxy) fail(format string, args ...any) {
	if p.tb == nil {
		panic(fmt.Sprintf(format, args...))
	}
	p.tb.Errorf(format, args...)
}

// Close stops the proxy: the process ends, and with it every connection it
// carried. It is safe to call more than once.
func (p *Proxy) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	p.in.Close()
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.exited
	}
}

// NewProxy starts the proxy on addr (a free loopback port if empty) in
// front of target, a client URL or host:port, and returns it ready, with
// its URL. tb receives the failures of its methods (nil: they panic); the
// caller closes it.
func NewProxy(tb testing.TB, addr, target string) (*Proxy, string, error) {
	if !strings.Contains(target, "://") { // ETCD_ENDPOINTS may give host:port
		target = "http://" + target
	}
	to, err := url.Parse(target)
	if err != nil {
		return nil, "", fmt.Errorf("etcdproc: proxy target %q: %w", target, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	bin, err := proxyBinary(ctx)
	if err != nil {
		return nil, "", err
	}
	if addr != "" {
		return startProxy(tb, bin, addr, to.Host)
	}
	// A port found free can be taken by another test before the proxy
	// binds it: try another one.
	for attempt := 0; ; attempt++ {
		ports, err := FreePorts(1)
		if err != nil {
			return nil, "", err
		}
		p, u, err := startProxy(tb, bin, fmt.Sprintf("127.0.0.1:%d", ports[0]), to.Host)
		if err == nil || attempt == 4 {
			return p, u, err
		}
	}
}

func startProxy(tb testing.TB, bin, addr, host string) (*Proxy, string, error) {
	cmd := exec.Command(bin, addr, host)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, "", fmt.Errorf("etcdproc: proxy: %w", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", fmt.Errorf("etcdproc: proxy: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("etcdproc: proxy: %w", err)
	}
	p := &Proxy{tb: tb, cmd: cmd, in: in, out: bufio.NewScanner(out), exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	// The program prints "ready" once listening, or an error and exits
	// (its own 10 s bound).
	if !p.out.Scan() || p.out.Text() != "ready" {
		line := p.out.Text()
		p.Close()
		return nil, "", errors.New("etcdproc: proxy on " + addr + ": " + line)
	}
	return p, "http://" + addr, nil
}

// ProxyT puts a proxy on a free loopback port in front of target and
// returns it with its own URL. It is closed when the test ends.
func ProxyT(tb testing.TB, target string) (*Proxy, string) {
	tb.Helper()
	p, u, err := NewProxy(tb, "", target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p, u
}

// ProxyAt is ProxyT on a given loopback address, for bringing a closed
// proxy back on the address its clients know.
func ProxyAt(tb testing.TB, addr, target string) *Proxy {
	tb.Helper()
	p, _, err := NewProxy(tb, addr, target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p
}

// ProxiedClient puts a proxy in front of target and opens a client that
// reaches etcd only through it. Both are closed when the test ends.
func ProxiedClient(tb testing.TB, target string) (*Proxy, *clientv3.Client, string) {
	tb.Helper()
	p, u := ProxyT(tb, target)
	return p, Client(tb, []string{u}), u
}
