// Package netlab builds a small network of hosts on one Linux machine for
// fault tests: each host is a network namespace with one interface, linked
// by a veth pair to a bridge that lives in a namespace of its own, and
// faults between any two hosts (a cut, a share of packets dropped), each
// direction on its own, are nftables rules in the sending host. Addresses
// come from 10.213.0.0/24 and exist only inside the lab's namespaces; the
// test process reaches a host by dialing from inside its namespace
// (Host.DialContext), never through an address of the machine's own.
//
// Namespaces are named Prefix + the test process's PID + a lab number +
// the host's name. Close removes a lab's namespaces (and with them its
// links and rules); New first removes the leftovers of labs whose process
// is gone (a killed test run), by those names only.
//
// It needs root, iproute2's ip and nftables' nft; Available says why not.
// tc netem is not used: the kernels this runs on may lack sch_netem.
//
// It is for partitions and loss between hosts, which every process on a
// host sees alike (members, lock holders); for faults on one client's
// connection to etcd use etcdproc.Proxy, for latency precise enough to
// measure rttlab, and for chosen messages held back internal/holdback.
package netlab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Prefix starts the name of every namespace this package makes.
const Prefix = "lfnet-"

// Available returns nil if labs can be built here, and otherwise an error
// saying why not (for a test's Skip).
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("netlab: network namespaces need root")
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("netlab: %s not installed (iproute2, nftables)", tool)
		}
	}
	return nil
}

// Lab is one network: a bridge and the hosts on it. Its methods are safe
// for concurrent use.
type Lab struct {
	id string // Prefix + pid + "-" + lab number
	sw string // the bridge's namespace

	mu     sync.Mutex
	hosts  []*Host
	faults map[[2]*Host]fault // from, to
	closed bool
}

// Host is one namespace on the lab's bridge.
type Host struct {
	Name string
	NS   string // the namespace's name, for ip netns exec
	IP   string // its address on the bridge
	lab  *Lab
}

// fault is what happens to packets from one host to another.
type fault struct {
	dropPercent int // 100: a cut
}

var labs atomic.Int64

// New builds an empty lab, after removing leftovers of dead test runs.
func New(ctx context.Context) (*Lab, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	removeLeftovers(ctx)
	l := &Lab{id: fmt.Sprintf("%s%d-%d", Prefix, os.Getpid(), labs.Add(1)), faults: map[[2]*Host]fault{}}
	l.sw = l.id + "-sw"
	steps := [][]string{
		{"ip", "netns", "add", l.sw},
		{"ip", "-n", l.sw, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", l.sw, "link", "set", "br0", "up"},
	}
	if err := run(ctx, steps...); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// AddHost adds a host to the lab: a namespace with loopback and eth0 up,
// eth0 on the bridge with the next free address, and an empty nftables
// table for its faults.
func (l *Lab) AddHost(ctx context.Context, name string) (*Host, error) {
	l.mu.Lock()
	n := len(l.hosts)
	l.mu.Unlock()
	if n >= 200 {
		return nil, errors.New("netlab: at most 200 hosts")
	}
	h := &Host{Name: name, NS: l.id + "-" + name, IP: fmt.Sprintf("10.213.0.%d", 10+n), lab: l}
	port := "v" + strconv.Itoa(n)
	steps := [][]string{
		{"ip", "netns", "add", h.NS},
		{"ip", "-n", h.NS, "link", "set", "lo", "up"},
		{"ip", "link", "add", "eth0", "netns", h.NS, "type", "veth", "peer", "name", port, "netns", l.sw},
		{"ip", "-n", l.sw, "link", "set", port, "master", "br0", "up"},
		{"ip", "-n", h.NS, "addr", "add", h.IP + "/24", "dev", "eth0"},
		{"ip", "-n", h.NS, "link", "set", "eth0", "up"},
		{"ip", "netns", "exec", h.NS, "nft", "add table inet netlab; add chain inet netlab out { type filter hook output priority 0 ; }"},
	}
	if err := run(ctx, steps...); err != nil {
		run(context.Background(), []string{"ip", "netns", "del", h.NS})
		return nil, err
	}
	l.mu.Lock()
	l.hosts = append(l.hosts, h)
	l.mu.Unlock()
	return h, nil
}

// Wrap is the command prefix that runs a program inside the host's
// namespace.
func (h *Host) Wrap() []string { return []string{"ip", "netns", "exec", h.NS} }

// DialContext opens a TCP connection to addr from inside the host's
// namespace, so the test process can reach the lab without an address of
// its own on it. The socket stays in that namespace for its lifetime.
func (h *Host) DialContext(ctx context.Context, addr string) (net.Conn, error) {
	var c net.Conn
	err := h.do(func() (err error) {
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

// Listen opens a TCP listener on addr inside the host's namespace.
func (h *Host) Listen(ctx context.Context, addr string) (net.Listener, error) {
	var ln net.Listener
	err := h.do(func() (err error) {
		ln, err = (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
		return err
	})
	return ln, err
}

// do runs f inside the host's namespace, on a goroutine of its own locked
// to its thread; sockets f opens stay in the namespace. A thread whose
// namespace could not be restored is not unlocked: the runtime ends it
// with the goroutine.
func (h *Host) do(f func() error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		restored, err := inNamespace(h.NS, f)
		if restored {
			runtime.UnlockOSThread()
		}
		ch <- err
	}()
	return <-ch
}

// inNamespace switches the calling (locked) thread into namespace ns, runs
// f, and switches it back; restored is false if that failed.
func inNamespace(ns string, f func() error) (restored bool, err error) {
	own, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return true, err
	}
	defer own.Close()
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		return true, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return true, fmt.Errorf("netlab: enter %s: %w", ns, err)
	}
	err = f()
	return unix.Setns(int(own.Fd()), unix.CLONE_NEWNET) == nil, err
}

// Cut drops every packet from one host to the other (one direction).
func (l *Lab) Cut(ctx context.Context, from, to *Host) error { return l.Drop(ctx, from, to, 100) }

// Drop drops percent of the packets from one host to the other (one
// direction); 0 heals that direction.
func (l *Lab) Drop(ctx context.Context, from, to *Host, percent int) error {
	if percent < 0 || percent > 100 {
		return fmt.Errorf("netlab: drop %d%%", percent)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if percent == 0 {
		delete(l.faults, [2]*Host{from, to})
	} else {
		l.faults[[2]*Host{from, to}] = fault{dropPercent: percent}
	}
	return l.applyLocked(ctx, from)
}

// Heal removes the fault from one host to the other.
func (l *Lab) Heal(ctx context.Context, from, to *Host) error { return l.Drop(ctx, from, to, 0) }

// Partition cuts both directions between every host of a and every host
// of b.
func (l *Lab) Partition(ctx context.Context, a, b []*Host) error {
	for _, x := range a {
		for _, y := range b {
			if err := l.Cut(ctx, x, y); err != nil {
				return err
			}
			if err := l.Cut(ctx, y, x); err != nil {
				return err
			}
		}
	}
	return nil
}

// HealAll removes every fault.
func (l *Lab) HealAll(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var from []*Host
	for k := range l.faults {
		if !slices.Contains(from, k[0]) {
			from = append(from, k[0])
		}
	}
	clear(l.faults)
	var errs []error
	for _, h := range from {
		errs = append(errs, l.applyLocked(ctx, h))
	}
	return errors.Join(errs...)
}

// applyLocked rewrites the rules of host from: one per host it has a fault
// towards. l.mu is held.
func (l *Lab) applyLocked(ctx context.Context, from *Host) error {
	var script strings.Builder
	script.WriteString("flush chain inet netlab out\n")
	for k, f := range l.faults {
		if k[0] != from {
			continue
		}
		if f.dropPercent >= 100 {
			fmt.Fprintf(&script, "add rule inet netlab out ip daddr %s drop\n", k[1].IP)
		} else {
			fmt.Fprintf(&script, "add rule inet netlab out ip daddr %s numgen random mod 100 < %d drop\n", k[1].IP, f.dropPercent)
		}
	}
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", from.NS, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("netlab: rules of %s: %v: %s", from.Name, err, bytes.TrimSpace(out))
	}
	return nil
}

// Close removes the lab's namespaces, and with them its links and rules.
func (l *Lab) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	hosts := l.hosts
	l.mu.Unlock()
	var errs []error
	for _, h := range hosts {
		errs = append(errs, run(context.Background(), []string{"ip", "netns", "del", h.NS}))
	}
	errs = append(errs, run(context.Background(), []string{"ip", "netns", "del", l.sw}))
	return errors.Join(errs...)
}

// removeLeftovers deletes namespaces of this package whose test process is
// gone: a run that was killed before its Close.
func removeLeftovers(ctx context.Context) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		rest, ok := strings.CutPrefix(name, Prefix)
		if !ok {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || processAlive(pid) {
			continue
		}
		run(ctx, []string{"ip", "netns", "del", name})
	}
}

func processAlive(pid int) bool {
	return unix.Kill(pid, 0) == nil
}

// run runs each command in turn, stopping at the first failure.
func run(ctx context.Context, cmds ...[]string) error {
	for _, c := range cmds {
		if out, err := exec.CommandContext(ctx, c[0], c[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("netlab: %s: %v: %s", strings.Join(c, " "), err, bytes.TrimSpace(out))
		}
	}
	return nil
}
