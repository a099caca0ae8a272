// Command quickstart takes a lock from two sessions in turn and prints the
// fencing tokens, on an embedded etcd unless -endpoints or ETCD_ENDPOINTS
// names one.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/leasefence/leasefence/internal/exampleenv"
	"github.com/leasefence/leasefence/lease"
)

func main() {
	endpoints := flag.String("endpoints", "", "etcd client URLs, comma-separated (default $ETCD_ENDPOINTS, else an embedded etcd)")
	flag.Parse()
	if err := run(*endpoints, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(endpoints string, out io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli, closeAll, err := exampleenv.Connect(ctx, endpoints, out)
	if err != nil {
		return err
	}
	defer closeAll()

	a, err := lease.NewSession(ctx, cli, lease.WithTTL(2*time.Second))
	if err != nil {
		return err
	}
	defer a.Close()
	b, err := lease.NewSession(ctx, cli, lease.WithTTL(2*time.Second))
	if err != nil {
		return err
	}
	defer b.Close()

	const name = "leasefence-quickstart/job"
	la, err := a.Lock(ctx, name)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "A holds %s, token %d\n", la.Key(), la.Token())
	if _, err := b.TryLock(ctx, name); errors.Is(err, lease.ErrLocked) {
		fmt.Fprintln(out, "B's TryLock: locked by A, as it should be")
	} else {
		return fmt.Errorf("TryLock of B while A holds: %v", err)
	}
	waiting := make(chan *lease.Lock, 1)
	go func() {
		lb, err := b.Lock(ctx, name)
		if err != nil {
			fmt.Fprintln(out, "B:", err)
		}
		waiting <- lb
	}()
	if err := la.Unlock(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "A unlocked: %v\n", la.Err())
	lb := <-waiting
	if lb == nil {
		return errors.New("lock never granted to B")
	}
	fmt.Fprintf(out, "B holds %s, token %d (> %d)\n", lb.Key(), lb.Token(), la.Token())
	return lb.Unlock(ctx)
}
