package etcdtest

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
)

// BuildEtcd builds the real etcd server from the module's own dependency
// (its root is a main package) into dir and returns the binary's path.
func BuildEtcd(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "etcd")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "go.etcd.io/etcd/server/v3")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("etcdtest: building etcd: %v\n%s", err, out)
	}
	return bin, nil
}

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

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// StartProcesses starts n (1 or 3) etcd processes from bin, with data in
// dir and the given heartbeat and election timeout in milliseconds, and
// waits until each serves requests.
func StartProcesses(ctx context.Context, bin, dir string, n int, tickMs, electionMs uint) (*ProcCluster, error) {
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	var initial []string
	for i := 0; i < n; i++ {
		initial = append(initial, fmt.Sprintf("p%d=http://127.0.0.1:%d", i, ports[2*i+1]))
	}
	c := &ProcCluster{}
	for i := 0; i < n; i++ {
		client, peer := fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]), fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1])
		p := &Proc{Name: fmt.Sprintf("p%d", i), ClientURL: client, bin: bin, args: []string{
			"--name", fmt.Sprintf("p%d", i), "--data-dir", filepath.Join(dir, fmt.Sprintf("p%d", i)),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-token", "leasefence-proc",
			"--heartbeat-interval", fmt.Sprint(tickMs), "--election-timeout", fmt.Sprint(electionMs),
			"--log-level", "error",
		}}
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
	cmd := exec.Command(p.bin, append(p.args, "--initial-cluster-state", state)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("etcdtest: start %s: %w", p.Name, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	return nil
}

func (p *Proc) waitServing(ctx context.Context) error {
	cli, err := NewClient([]string{p.ClientURL})
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
		if ctx.Err() != nil {
			return fmt.Errorf("etcdtest: %s not serving: %w", p.Name, err)
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
		cli, err := NewClient([]string{p.ClientURL})
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
	return nil, errors.New("etcdtest: no member leads")
}

// Close kills every member.
func (c *ProcCluster) Close() {
	for _, p := range c.Members {
		p.Kill()
	}
}
