package etcdproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ProcCluster is a cluster of etcd child processes, which unlike embedded
// members can be killed outright.
type ProcCluster struct {
	Members []*Proc
}

// Proc is one etcd child process.
type Proc struct {
	Name      string
	ClientURL string
	args      []string
	bin       string
	wrap      []string
	newClient func([]string) (*clientv3.Client, error)

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// StartProcesses starts n (1 or 3) etcd processes from bin, with data in
// dir and the given heartbeat and election timeout in milliseconds, and
// waits until each serves requests.
func StartProcesses(ctx context.Context, bin, dir string, n int, tickMs, electionMs uint) (*ProcCluster, error) {
	// A port found free can be taken by another process before etcd binds
	// it: try new ports, with a fresh data directory each time.
	var err error
	for attempt := 0; ; attempt++ {
		var ports []int
		if ports, err = FreePorts(2 * n); err != nil {
			return nil, err
		}
		hosts := make([]ProcHost, n)
		for i := range hosts {
			hosts[i] = ProcHost{IP: "127.0.0.1", ClientPort: ports[2*i], PeerPort: ports[2*i+1]}
		}
		var c *ProcCluster
		c, err = StartProcessesOn(ctx, bin, filepath.Join(dir, fmt.Sprint(attempt)), hosts, tickMs, electionMs, NewClient)
		if err == nil || attempt == 2 || ctx.Err() != nil {
			return c, err
		}
	}
}

// ProcHost is where one member of StartProcessesOn runs: its address and
// ports, and the command prefix that puts it there (such as ip netns exec
// NS), if any.
type ProcHost struct {
	IP                   string
	ClientPort, PeerPort int
	Wrap                 []string
	// AdvertiseClient and AdvertisePeer, if set, are the URLs the member
	// gives to clients and peers instead of the ones it listens on: a
	// forwarder's in front of it, say.
	AdvertiseClient, AdvertisePeer string
}

// StartProcessesWith starts one etcd process from bin per host, with the
// extra flags, as StartProcessesOn does.
func StartProcessesWith(ctx context.Context, bin, dir string, hosts []ProcHost, extra []string, newClient func([]string) (*clientv3.Client, error)) (*ProcCluster, error) {
	return startOn(ctx, bin, dir, hosts, extra, newClient)
}

// urls are where h listens, and what it advertises.
func (h ProcHost) urls() (client, peer, advClient, advPeer string) {
	client, peer = fmt.Sprintf("http://%s:%d", h.IP, h.ClientPort), fmt.Sprintf("http://%s:%d", h.IP, h.PeerPort)
	advClient, advPeer = client, peer
	if h.AdvertiseClient != "" {
		advClient = h.AdvertiseClient
	}
	if h.AdvertisePeer != "" {
		advPeer = h.AdvertisePeer
	}
	return client, peer, advClient, advPeer
}

// StartProcessesOn starts one etcd process from bin per host, as
// StartProcesses does, and waits, through clients from newClient, until
// each serves requests.
func StartProcessesOn(ctx context.Context, bin, dir string, hosts []ProcHost, tickMs, electionMs uint, newClient func([]string) (*clientv3.Client, error)) (*ProcCluster, error) {
	timing := []string{"--heartbeat-interval", fmt.Sprint(tickMs), "--election-timeout", fmt.Sprint(electionMs)}
	return startOn(ctx, bin, dir, hosts, timing, newClient)
}

// startOn starts one etcd process per host with the extra flags, and waits
// until each serves requests.
func startOn(ctx context.Context, bin, dir string, hosts []ProcHost, extra []string, newClient func([]string) (*clientv3.Client, error)) (*ProcCluster, error) {
	var initial []string
	for i, h := range hosts {
		_, _, _, advPeer := h.urls()
		initial = append(initial, fmt.Sprintf("p%d=%s", i, advPeer))
	}
	c := &ProcCluster{}
	for i, h := range hosts {
		client, peer, advClient, advPeer := h.urls()
		p := &Proc{Name: fmt.Sprintf("p%d", i), ClientURL: client, bin: bin, wrap: h.Wrap, newClient: newClient, args: []string{
			"--name", fmt.Sprintf("p%d", i), "--data-dir", filepath.Join(dir, fmt.Sprintf("p%d", i)),
			"--listen-client-urls", client, "--advertise-client-urls", advClient,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", advPeer,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-token", "leasefence-proc",
			"--log-level", "error",
		}}
		p.args = append(p.args, extra...)
		c.Members = append(c.Members, p)
		if err := p.start("new"); err != nil {
			c.Close()
			return nil, err
		}
	}
	for _, p := range c.Members {
		if err := p.waitServing(ctx); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

func (p *Proc) start(state string) error {
	argv := append(append(append([]string{}, p.wrap...), p.bin), p.args...)
	argv = append(argv, "--initial-cluster-state", state)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	// A test binary that dies (a panic, a timeout) takes its members along.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("etcdproc: start %s: %w", p.Name, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	return nil
}

// waitServing waits until p answers a read. A member that exits first (its
// port taken before it bound it, say) is reported at once, so that the
// caller can retry on new ports rather than wait out the timeout.
func (p *Proc) waitServing(ctx context.Context) error {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	cli, err := p.newClient([]string{p.ClientURL})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		rctx, stop := context.WithTimeout(ctx, time.Second)
		_, err := cli.Get(rctx, "leasefence-health")
		stop()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("etcdproc: %s exited before serving: %w", p.Name, err)
		default:
		}
		if ctx.Err() != nil {
			return fmt.Errorf("etcdproc: %s not serving: %w", p.Name, err)
		}
	}
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Proc) Kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// Restart starts a killed member again on its data, and waits until it
// serves.
func (p *Proc) Restart(ctx context.Context) error {
	if err := p.start("existing"); err != nil {
		return err
	}
	return p.waitServing(ctx)
}

// Endpoints lists the client URLs.
func (c *ProcCluster) Endpoints() []string {
	var eps []string
	for _, p := range c.Members {
		eps = append(eps, p.ClientURL)
	}
	return eps
}

// Leader asks each member for its status and returns the one that leads.
func (c *ProcCluster) Leader(ctx context.Context) (*Proc, error) {
	for _, p := range c.Members {
		cli, err := p.newClient([]string{p.ClientURL})
		if err != nil {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := cli.Status(sctx, p.ClientURL)
		cancel()
		cli.Close()
		if err == nil && st.Leader == st.Header.MemberId {
			return p, nil
		}
	}
	return nil, errors.New("etcdproc: no member leads")
}

// Close kills every member.
func (c *ProcCluster) Close() {
	for _, p := range c.Members {
		p.Kill()
	}
}
