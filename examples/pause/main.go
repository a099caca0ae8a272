// Command pause runs Kleppmann's scenario end to end against etcd, twice.
//
// Client A, a separate process, takes a lock, checks that it still holds
// it, and is then really stopped (SIGSTOP) past its lease. etcd expires the
// lease and client B takes the lock, with a larger token, and writes. A is
// resumed (SIGCONT) and makes its write.
//
// Unfenced, A's late write silently overwrites B's. Fenced, the write goes
// through a fence.Resource guard and is refused, naming both tokens. The
// exit status is 0 only if the fenced run refused A's write and the data is
// B's.
//
// With neither -endpoints nor ETCD_ENDPOINTS it starts an embedded etcd.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/examples/internal/exampleetcd"
	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/exampleenv"
	"github.com/leasefence/leasefence/lease"
)

// Environment of the child process, client A.
const (
	envEndpoints = "PAUSE_ENDPOINTS"
	envPrefix    = "PAUSE_PREFIX"
	envFenced    = "PAUSE_FENCED"
	envTTL       = "PAUSE_TTL"
)

func main() {
	if os.Getenv(exampleenv.ChildEnv) == "client-a" {
		if err := clientA(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "client A:", err)
			os.Exit(1)
		}
		return
	}
	endpoints := flag.String("endpoints", "", "etcd client URLs, comma-separated (default $ETCD_ENDPOINTS, else an embedded etcd)")
	ttl := flag.Duration("ttl", 2*time.Second, "lease TTL of both clients (etcd grants at least 2s by default)")
	flag.Parse()
	if err := run(*endpoints, *ttl, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "pause:", err)
		os.Exit(1)
	}
}

// errUnsafe is returned when the fenced run did not protect B's data.
var errUnsafe = errors.New("the fenced run did not refuse A's stale write")

func run(endpoints string, ttl time.Duration, out io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli, closeAll, err := exampleetcd.Connect(ctx, endpoints, out)
	if err != nil {
		return err
	}
	defer closeAll()
	eps := cli.Endpoints()
	base := fmt.Sprintf("pause-%x", time.Now().UnixNano()&0xffffff)

	var results []result
	for _, fenced := range []bool{false, true} {
		title := "UNFENCED: A and B write with plain puts"
		if fenced {
			title = "FENCED: A and B write through fence.Resource(record, token)"
		}
		fmt.Fprintf(out, "\n=== %s ===\n", title)
		mode := "unfenced"
		if fenced {
			mode = "fenced"
		}
		r, err := scenario(ctx, cli, eps, base+"/"+mode, fenced, ttl, out)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	fmt.Fprintln(out, "\n=== summary ===")
	for _, r := range results {
		fmt.Fprintln(out, r.summary())
	}
	if f := results[1]; !f.refused || f.final != f.bValue {
		return errUnsafe
	}
	return nil
}

type result struct {
	fenced         bool
	aToken, bToken int64
	refused        bool
	final, bValue  string
}

func (r result) summary() string {
	mode := "unfenced"
	if r.fenced {
		mode = "fenced  "
	}
	switch {
	case r.refused && r.final == r.bValue:
		return fmt.Sprintf("%s: A's write with token %d refused, B's data (token %d) kept: SAFE", mode, r.aToken, r.bToken)
	case r.final != r.bValue:
		return fmt.Sprintf("%s: A's write with token %d overwrote B's (token %d): data is %q: LOST UPDATE", mode, r.aToken, r.bToken, r.final)
	}
	return fmt.Sprintf("%s: data is %q", mode, r.final)
}

func scenario(ctx context.Context, cli *clientv3.Client, eps []string, prefix string, fenced bool, ttl time.Duration, out io.Writer) (result, error) {
	res := result{fenced: fenced}
	sc := &pauseScene{ctx: ctx, cli: cli, prefix: prefix, fenced: fenced, ttl: ttl,
		lockName: prefix + "/lock", tl: exampleenv.NewTimeline(out)}
	a, err := exampleenv.StartChild(ctx, "client A", "client-a",
		envEndpoints+"="+strings.Join(eps, ","), envPrefix+"="+prefix,
		envFenced+"="+strconv.FormatBool(fenced), envTTL+"="+ttl.String())
	if err != nil {
		return res, err
	}
	defer a.Stop()
	defer sc.closers.Run()
	sc.a = a
	sc.tl.Printf("A", "started as process %d", a.Pid())

	if err := sc.aStartsWriting(&res); err != nil {
		return res, err
	}
	if err := sc.pauseAUntilExpired(); err != nil {
		return res, err
	}
	lb, err := sc.bTakesOver(&res)
	if err != nil {
		return res, err
	}
	if err := sc.aResumes(&res); err != nil {
		return res, err
	}
	if err := sc.readData(&res); err != nil {
		return res, err
	}
	return res, lb.Unlock(ctx)
}

// pauseScene is one run of the story: client A (a child process) and B
// (this process) writing one key under one lock.
type pauseScene struct {
	ctx      context.Context
	cli      *clientv3.Client
	prefix   string
	fenced   bool
	ttl      time.Duration
	lockName string
	tl       *exampleenv.Timeline
	a        *exampleenv.Child
	closers  exampleenv.Cleanup
}

// aStartsWriting waits until A holds the lock and has checked lock.Err()
// just before its write.
func (sc *pauseScene) aStartsWriting(res *result) error {
	tok, err := sc.a.Expect("LOCKED ", 30*time.Second)
	if err != nil {
		return err
	}
	res.aToken, _ = strconv.ParseInt(tok, 10, 64)
	sc.tl.Printf("A", "takes the lock %q: token %d, lease TTL %v", sc.lockName, res.aToken, sc.ttl)
	if _, err := sc.a.Expect("CHECKED", 10*time.Second); err != nil {
		return err
	}
	sc.tl.Printf("A", "checks lock.Err() == nil: still the holder. Starts its write...")
	return nil
}

// pauseAUntilExpired stops A with SIGSTOP and waits until etcd has
// expired its lease and deleted its lock key.
func (sc *pauseScene) pauseAUntilExpired() error {
	return exampleenv.PauseUntilExpired(sc.ctx, sc.cli, sc.a, sc.lockName, sc.tl)
}

// bTakesOver takes the lock for B and writes B's data. The returned lock
// is released by the caller; the session is closed with the scene.
func (sc *pauseScene) bTakesOver(res *result) (*lease.Lock, error) {
	s, err := lease.NewSession(sc.ctx, sc.cli, lease.WithTTL(sc.ttl))
	if err != nil {
		return nil, err
	}
	sc.closers.Add(func() { s.Close() })
	lb, err := s.Lock(sc.ctx, sc.lockName)
	if err != nil {
		return nil, err
	}
	res.bToken = lb.Token()
	sc.tl.Printf("B", "takes the lock: token %d (> %d)", lb.Token(), res.aToken)
	res.bValue = fmt.Sprintf("B's data (token %d)", lb.Token())
	if err := write(sc.ctx, sc.cli, sc.prefix, sc.fenced, lb.Token(), res.bValue); err != nil {
		return nil, fmt.Errorf("write of B: %w", err)
	}
	sc.tl.Printf("B", "writes %q", res.bValue)
	return lb, nil
}

// aResumes continues A, which finishes the write it started with its old
// token.
func (sc *pauseScene) aResumes(res *result) error {
	if err := sc.a.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	sc.tl.Printf("A", "resumes: SIGCONT. It still believes it holds the lock, and finishes its write")
	if err := sc.a.Send("go"); err != nil {
		return err
	}
	outcome, err := sc.a.Expect("WRITE ", 30*time.Second)
	if err != nil {
		return err
	}
	res.refused = outcome != "ok"
	if res.refused {
		sc.tl.Printf("A", "write REFUSED: %s", outcome)
	} else {
		sc.tl.Printf("A", "write accepted: nothing stopped it")
	}
	if lost, err := sc.a.Expect("LOCKERR ", 10*time.Second); err == nil {
		sc.tl.Printf("A", "lock.Err() now says %q: an early warning that came too late", lost)
	}
	if err := sc.a.Wait(); err != nil {
		return fmt.Errorf("client A: %v\n%s", err, sc.a.Stderr())
	}
	return nil
}

// readData reads the data key back: whose write stands?
func (sc *pauseScene) readData(res *result) error {
	g, err := sc.cli.Get(sc.ctx, sc.prefix+"/data")
	if err != nil || len(g.Kvs) != 1 {
		return fmt.Errorf("reading the data: %v %v", g, err)
	}
	res.final = string(g.Kvs[0].Value)
	if res.final == res.bValue {
		sc.tl.Printf("data", "%q: B's write stands", res.final)
	} else {
		sc.tl.Printf("data", "%q: B's write was silently overwritten by a client that no longer held the lock", res.final)
	}
	return nil
}

// write is how both clients write the data: plain, or fenced by a
// resource-side record of the highest token accepted.
func write(ctx context.Context, cli *clientv3.Client, prefix string, fenced bool, token int64, value string) error {
	put := clientv3.OpPut(prefix+"/data", value)
	if !fenced {
		_, err := cli.Do(ctx, put)
		return err
	}
	_, err := fence.NewTxn(ctx, cli, fence.Resource(prefix+"/fence", token)).Then(put).Commit()
	return err
}

// clientA is the child process: it takes the lock, checks it, and then
// does its "work" (waiting for a line on stdin, during which it is
// stopped), and writes with the token it got.
func clientA(in io.Reader, out io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ttl, err := time.ParseDuration(os.Getenv(envTTL))
	if err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(os.Getenv(envEndpoints), ","), DialTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer cli.Close()
	s, err := lease.NewSession(ctx, cli, lease.WithTTL(ttl))
	if err != nil {
		return err
	}
	defer s.Close()
	prefix := os.Getenv(envPrefix)
	l, err := s.Lock(ctx, prefix+"/lock")
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "LOCKED", l.Token())
	if l.Err() != nil {
		return l.Err()
	}
	fmt.Fprintln(out, "CHECKED")
	if _, err := bufio.NewReader(in).ReadString('\n'); err != nil {
		return err
	}
	value := fmt.Sprintf("A's data (token %d)", l.Token())
	if err := write(ctx, cli, prefix, os.Getenv(envFenced) == "true", l.Token(), value); err != nil {
		if !errors.Is(err, fence.ErrStale) {
			return err
		}
		fmt.Fprintln(out, "WRITE", err)
	} else {
		fmt.Fprintln(out, "WRITE ok")
	}
	<-l.Done()
	fmt.Fprintln(out, "LOCKERR", l.Err())
	return nil
}
