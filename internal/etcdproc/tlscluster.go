package etcdproc

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// StartTLS starts a member whose client port speaks TLS only (https),
// with certs.Server's files: with its ClientCertAuth set, as GenerateCerts
// sets it, a client must present a certificate signed by certs.CAFile. It
// waits until the member serves a client with the first of certs.Clients
// by name (the CA alone if there is none), or ctx ends. The peer port
// stays plain. Close stops it.
func StartTLS(ctx context.Context, certs *Certs) (*Cluster, error) {
	bin, err := Binary(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "leasefence-etcd-")
	if err != nil {
		return nil, fmt.Errorf("etcdproc: %w", err)
	}
	newClient := tlsClient(certs)
	// A port found free can be taken by another process before etcd binds
	// it: try new ports.
	for attempt := 0; ; attempt++ {
		var ports []int
		ports, err = FreePorts(2)
		if err != nil {
			break
		}
		var p *Proc
		p, err = startTLSProc(ctx, bin, filepath.Join(dir, fmt.Sprint(attempt)), ports, certs.Server, newClient)
		if err == nil {
			return &Cluster{procs: &ProcCluster{Members: []*Proc{p}}, dir: dir}, nil
		}
		if attempt == 2 || ctx.Err() != nil {
			break
		}
	}
	os.RemoveAll(dir)
	return nil, err
}

// StartTLST is StartTLS for a test: the member is stopped when the test
// ends.
func StartTLST(tb testing.TB, certs *Certs) *Cluster {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := StartTLS(ctx, certs)
	if err != nil {
		tb.Fatalf("start etcd with TLS: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

// startTLSProc starts one member with its client port on ports[0] (https,
// with server's files) and its peer port on ports[1], and waits until it
// serves a client from newClient.
func startTLSProc(ctx context.Context, bin, dataDir string, ports []int, server transport.TLSInfo, newClient func([]string) (*clientv3.Client, error)) (*Proc, error) {
	client := fmt.Sprintf("https://127.0.0.1:%d", ports[0])
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	p := &Proc{Name: "p0", ClientURL: client, bin: bin, newClient: newClient, args: []string{
		"--name", "p0", "--data-dir", dataDir,
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "p0=" + peer, "--initial-cluster-token", "leasefence-proc",
		"--log-level", "error",
		"--cert-file", server.CertFile, "--key-file", server.KeyFile,
	}}
	if server.TrustedCAFile != "" {
		p.args = append(p.args, "--trusted-ca-file", server.TrustedCAFile)
	}
	if server.ClientCertAuth {
		p.args = append(p.args, "--client-cert-auth")
	}
	if err := p.start("new"); err != nil {
		return nil, err
	}
	if err := p.waitServing(ctx); err != nil {
		p.Kill()
		return nil, err
	}
	return p, nil
}

// tlsClient opens quiet clients, as NewClient does, that trust certs.CAFile
// and present the certificate of the first of certs.Clients by name, if
// any. Before authentication is enabled etcd takes any client whose
// certificate its CA signed.
func tlsClient(certs *Certs) func([]string) (*clientv3.Client, error) {
	info := transport.TLSInfo{TrustedCAFile: certs.CAFile}
	if names := slices.Sorted(maps.Keys(certs.Clients)); len(names) > 0 {
		info = certs.Clients[names[0]]
	}
	return func(endpoints []string) (*clientv3.Client, error) {
		tc, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcdproc: client TLS: %w", err)
		}
		return clientv3.New(clientv3.Config{
			Endpoints:   endpoints,
			TLS:         tc,
			DialTimeout: 5 * time.Second,
			Logger:      zap.NewNop(),
		})
	}
}
