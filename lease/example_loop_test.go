package lease_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/lease"
)

// A long-running holder: each holding resumes from the fenced state with
// a claim, then writes on every tick until the lock is lost (Run takes it
// again, and calls fn with a larger token) or the service stops. It checks
// ctx after every wait, and each write gets a WriteContext of its own:
// one made per holding would expire a TTL after the holding began.
func ExampleRun_loop() {
	ctx, stop := context.WithCancel(context.Background()) // a service's: signal.NotifyContext
	defer stop()
	cli := exampleClient()
	defer cli.Close()
	lg, err := zap.NewProduction(zap.IncreaseLevel(zap.WarnLevel)) // warnings: losses, etcd not answering
	if err != nil {
		log.Fatal(err)
	}
	defer lg.Sync()

	err = lease.Run(ctx, cli, "examples/loop", func(ctx context.Context, l *lease.Lock) error {
		wctx, cancel := l.WriteContext(ctx)
		resp, err := fence.NewTxn(wctx, cli, fence.Claim("examples/loop-fence", l.Token())).
			Then(clientv3.OpGet("examples/loop-count")).
			Commit()
		cancel()
		if err != nil {
			return err
		}
		count := 0
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			count, _ = strconv.Atoi(string(kvs[0].Value))
		}
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done(): // the lock is lost, or the service stops
				return context.Cause(ctx)
			case <-tick.C:
			}
			count++
			wctx, cancel := l.WriteContext(ctx)
			_, err := fence.NewTxn(wctx, cli, fence.Resource("examples/loop-fence", l.Token())).
				Then(clientv3.OpPut("examples/loop-count", strconv.Itoa(count))).
				Commit()
			cancel()
			if err != nil {
				return err // refused as stale: Run finds the loss and takes the lock again
			}
			fmt.Println("wrote", count)
			if count == 3 {
				stop() // here, the service stopping
			}
		}
	}, lease.WithLogger(lg))
	fmt.Println("stopped:", errors.Is(err, context.Canceled))
	// Output:
	// wrote 1
	// wrote 2
	// wrote 3
	// stopped: true
}
