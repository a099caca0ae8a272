package rttlab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
)

// Config says what a Lab runs.
type Config struct {
	Members int           // 1, 3 or 5
	Client  time.Duration // one-way delay between a client and its member
	Peer    time.Duration // one-way delay between two members
	// NoFsync runs etcd with --unsafe-no-fsync; by default it fsyncs, as
	// a deployment does.
	NoFsync bool
	// TickMs and ElectionMs are etcd's heartbeat interval and election
	// timeout, in milliseconds (0: etcd's defaults, 100 and 1000).
	TickMs, ElectionMs uint
}

// Lab is an etcd cluster whose members run as processes of their own,
// each behind a client link and a peer link: a client on member i pays
// Client each way to reach it, and a member's message to another pays
// Peer. Members are processes rather than embedded servers so that their
// CPU time, goroutines and garbage are not the measuring process's, as
// in a deployment.
type Lab struct {
	procs       *etcdproc.ProcCluster
	clientLinks []*Link
	peerLinks   []*Link
	dir         string
}

// Start starts a lab and waits until every member serves through its
// links. Close stops it and removes everything it made.
func Start(ctx context.Context, cfg Config) (*Lab, error) {
	if cfg.Members != 1 && cfg.Members != 3 && cfg.Members != 5 {
		return nil, fmt.Errorf("rttlab: %d members: want 1, 3 or 5", cfg.Members)
	}
	bin, err := etcdproc.Binary(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "rttlab")
	if err != nil {
		return nil, err
	}
	var extra []string
	if cfg.TickMs > 0 {
		extra = append(extra, "--heartbeat-interval", fmt.Sprint(cfg.TickMs))
	}
	if cfg.ElectionMs > 0 {
		extra = append(extra, "--election-timeout", fmt.Sprint(cfg.ElectionMs))
	}
	if cfg.NoFsync {
		extra = append(extra, "--unsafe-no-fsync")
	}
	// A port found free can be taken by another process (or by one of our
	// own links) before etcd binds it: try again on new ports.
	for attempt := 0; ; attempt++ {
		l := &Lab{dir: dir}
		if l.procs, err = l.start(ctx, cfg, bin, filepath.Join(dir, fmt.Sprint(attempt)), extra); err == nil {
			return l, nil
		}
		l.closeParts()
		if attempt == 2 || ctx.Err() != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
}

// start makes the links and starts the members behind them.
func (l *Lab) start(ctx context.Context, cfg Config, bin, dataDir string, extra []string) (*etcdproc.ProcCluster, error) {
	hosts, err := l.links(cfg)
	if err != nil {
		return nil, err
	}
	return etcdproc.StartProcessesWith(ctx, bin, dataDir, hosts, extra, etcdproc.NewClient)
}

// links makes a client and a peer link for each member, in front of the
// ports it will listen on.
func (l *Lab) links(cfg Config) ([]etcdproc.ProcHost, error) {
	// The members' ports stay bound while the links take theirs, so that
	// no link is given a member's port.
	ports, release, err := etcdproc.HoldPorts(2 * cfg.Members)
	if err != nil {
		return nil, err
	}
	defer release()
	hosts := make([]etcdproc.ProcHost, cfg.Members)
	for i := range hosts {
		h := etcdproc.ProcHost{IP: "127.0.0.1", ClientPort: ports[2*i], PeerPort: ports[2*i+1]}
		cl, err := NewLink(fmt.Sprintf("127.0.0.1:%d", h.ClientPort), cfg.Client)
		if err != nil {
			return nil, err
		}
		l.clientLinks = append(l.clientLinks, cl)
		pl, err := NewLink(fmt.Sprintf("127.0.0.1:%d", h.PeerPort), cfg.Peer)
		if err != nil {
			return nil, err
		}
		l.peerLinks = append(l.peerLinks, pl)
		h.AdvertiseClient, h.AdvertisePeer = "http://"+cl.Addr(), "http://"+pl.Addr()
		hosts[i] = h
	}
	return hosts, nil
}

// Endpoint is member i's client URL through its client link.
func (l *Lab) Endpoint(i int) string { return "http://" + l.clientLinks[i].Addr() }

// Client is a client of member i alone, through its client link.
func (l *Lab) Client(i int) (*clientv3.Client, error) {
	return etcdproc.NewClient([]string{l.Endpoint(i)})
}

// ClientLink and PeerLink are member i's links, to cut or slow.
func (l *Lab) ClientLink(i int) *Link { return l.clientLinks[i] }

// PeerLink is the link in front of member i's peer port: what the other
// members send it crosses it, and so do its answers.
func (l *Lab) PeerLink(i int) *Link { return l.peerLinks[i] }

// SetDelay changes every link's one-way delay.
func (l *Lab) SetDelay(client, peer time.Duration) {
	for _, k := range l.clientLinks {
		k.SetDelay(client, 0)
	}
	for _, k := range l.peerLinks {
		k.SetDelay(peer, 0)
	}
}

// Leader is the index of the member that leads.
func (l *Lab) Leader(ctx context.Context) (int, error) {
	p, err := l.procs.Leader(ctx)
	if err != nil {
		return -1, err
	}
	for i, m := range l.procs.Members {
		if m == p {
			return i, nil
		}
	}
	return -1, errors.New("rttlab: leader not a member")
}

// Close stops the members and the links and removes the members' data.
func (l *Lab) Close() {
	l.closeParts()
	os.RemoveAll(l.dir)
}

// closeParts stops the members and the links.
func (l *Lab) closeParts() {
	if l.procs != nil {
		l.procs.Close()
	}
	for _, k := range append(l.clientLinks, l.peerLinks...) {
		k.Close()
	}
}
