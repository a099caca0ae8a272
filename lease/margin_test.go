package lease_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// envMarginTrials selects the long run of TestLossMarginUnderLoad: that
// many trials (the ordinary run makes one batch).
const envMarginTrials = "LEASEFENCE_MARGIN_TRIALS"

// marginBatch is how many holders one batch cuts off at once.
const marginBatch = 20

// marginTrial is one holder cut off from etcd: when its session's local
// deadline was, when the session reported the loss (Hooks.SessionLost),
// when the lock reported its end (Hooks.Ended, just before Done closes),
// when a goroutine waiting on Lock.Done woke, whether the key was still in
// etcd in a read it sent then, and when etcd's deletion of the key arrived
// on a watch of a client not behind the cut.
type marginTrial struct {
	deadline, lost, ended, done, deleted time.Time
	read                                 time.Duration // how long the read after Done took
	present                              bool          // the key, in the read after Done
	openAtDeletion                       bool          // Done was still open when the deletion arrived
}

// TestLossMarginUnderLoad cuts holders off from etcd on a busy machine
// (spinning goroutines in this process, spinning processes beside it) and
// fails if any holder's Lock.Done was still open when etcd's deletion of
// its key arrived. Issue 46 saw, under load, locks end up to 210 ms after
// the local deadline, past the loss margin and so past etcd's earliest
// expiry: etcd's revoke batch, not the margin, kept Done ahead. The
// ordinary run makes one batch; LEASEFENCE_MARGIN_TRIALS=N makes N trials,
// logs the distribution, and with 200 or more also fails if more than 1%
// of the locks ended past etcd's earliest expiry (docs/testing.md).
func TestLossMarginUnderLoad(t *testing.T) {
	trials := marginBatch
	if v := os.Getenv(envMarginTrials); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q: want a positive number", envMarginTrials, v)
		}
		trials = n
	}
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	load0 := loadAverage()
	stop := busy(t, 3, 3)
	defer stop()
	var all []marginTrial
	for len(all) < trials {
		n := min(marginBatch, trials-len(all))
		t.Run(fmt.Sprintf("batch%d", len(all)/marginBatch), func(t *testing.T) {
			all = append(all, marginBatchRun(t, cli, n, len(all)/marginBatch%2 == 1)...)
		})
		if t.Failed() {
			break
		}
	}
	stop()
	reportMargin(t, all, load0, loadAverage())
}

// marginBatchRun takes n locks on sessions of the shortest TTL through one
// proxy (renewed through one Keeper if keeper), cuts the proxy off both
// ways, and records each holder's loss.
func marginBatchRun(t *testing.T, cli *clientv3.Client, n int, keeper bool) []marginTrial {
	p, viaProxy, _ := etcdproc.ProxiedClient(t, etcd.Endpoints()[0])
	prefix := etcdproc.Name(t, "margin") + "-"
	ctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
	defer cancel()
	wch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	<-wch
	trials := make([]marginTrial, n)
	locks := make([]*lease.Lock, n)
	sessions := make([]*lease.Session, n)
	var mu sync.Mutex
	opts := []lease.Option{lease.WithTTL(shortTTL)}
	if keeper {
		k, err := lease.NewKeeper(viaProxy)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { k.Close() })
		opts = append(opts, lease.WithKeeper(k))
	}
	byKey := make(map[string]int)
	for i := range n {
		hooks := &lease.Hooks{
			SessionLost: func(error) {
				at := time.Now()
				mu.Lock()
				trials[i].lost = at
				mu.Unlock()
			},
			Ended: func(string, int64, time.Duration, error) {
				at := time.Now()
				mu.Lock()
				trials[i].ended = at
				mu.Unlock()
			},
		}
		sessions[i] = newSession(t, viaProxy, append(opts, lease.WithHooks(hooks))...)
		locks[i] = mustLock(t, sessions[i], fmt.Sprintf("%s%d", prefix, i))
		byKey[locks[i].Key()] = i
	}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for seen := 0; seen < n; {
			wr, ok := <-wch
			if !ok {
				return
			}
			at := time.Now()
			for _, ev := range wr.Events {
				i, ok := byKey[string(ev.Kv.Key)]
				if ev.Type != mvccpb.DELETE || !ok {
					continue
				}
				seen++
				mu.Lock()
				trials[i].deleted = at
				select {
				case <-locks[i].Done():
				default:
					trials[i].openAtDeletion = true
				}
				mu.Unlock()
			}
		}
	}()

	p.BlackholeTx()
	p.BlackholeRx()
	var wg sync.WaitGroup
	for i, l := range locks {
		wg.Go(func() {
			select {
			case <-l.Done():
			case <-time.After(3 * shortTTL):
				t.Errorf("lock %d: Done not closed %v after the cut", i, 3*shortTTL)
				return
			}
			done := time.Now()
			resp, err := cli.Get(ctx, l.Key())
			read := time.Since(done)
			mu.Lock()
			defer mu.Unlock()
			trials[i].done, trials[i].read = done, read
			trials[i].present = err == nil && len(resp.Kvs) == 1 && resp.Kvs[0].CreateRevision == l.Token()
		})
	}
	wg.Wait()
	select {
	case <-watched:
	case <-time.After(3 * shortTTL):
		t.Fatalf("etcd did not delete every key within %v", 3*shortTTL)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range locks {
		trials[i].deadline = sessions[i].Deadline()
	}
	return slices.Clone(trials)
}

// busy keeps the machine busy until stop: procs goroutines spinning in
// this process, allocating a little (so that the collector runs too), and
// children processes spinning beside it; after 30 minutes at most.
func busy(t *testing.T, procs, children int) (stop func()) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	var wg sync.WaitGroup
	for range procs {
		wg.Go(func() {
			var sink []byte
			for i := 0; ctx.Err() == nil; i++ {
				if i%(1<<20) == 0 { // about a millisecond
					sink = make([]byte, 64<<10)
				}
			}
			_ = sink
		})
	}
	for range children {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Logf("no spinning child: %v", err)
			continue
		}
		wg.Go(func() {
			<-ctx.Done()
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	return sync.OnceFunc(func() {
		cancel()
		wg.Wait()
	})
}

// loadAverage is the one-minute load average, or "?".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

// reportMargin logs the distributions (times after the local deadline,
// and the deletion's arrival after the lock ended and after the deadline). It fails for every holder
// whose Done was still open when etcd's deletion of its key arrived: proof
// that Done closed after the deletion. A key found in the read sent after
// Done proves the other order; a trial with neither proof is counted. With
// 200 trials or more it also fails if more than 1% of the locks ended
// past etcd's earliest expiry (the deadline plus the loss margin), where
// only etcd's revoke batch stood between them and a successor.
func reportMargin(t *testing.T, trials []marginTrial, load0, load1 string) {
	var lost, ended, seen, gap, etcdGap, read []time.Duration
	after, before, pastExpiry := 0, 0, 0
	for i, tr := range trials {
		if tr.done.IsZero() || tr.deleted.IsZero() || tr.ended.IsZero() {
			continue
		}
		lost = append(lost, tr.lost.Sub(tr.deadline))
		ended = append(ended, tr.ended.Sub(tr.deadline))
		seen = append(seen, tr.done.Sub(tr.deadline))
		gap = append(gap, tr.deleted.Sub(tr.ended))
		etcdGap = append(etcdGap, tr.deleted.Sub(tr.deadline))
		read = append(read, tr.read)
		if tr.present {
			before++
		}
		if tr.ended.Sub(tr.deadline) > shortTTL/20 {
			pastExpiry++
		}
		if tr.openAtDeletion {
			after++
			t.Errorf("trial %d: Done still open when etcd's deletion of the key arrived (%v after the local deadline)",
				i, tr.deleted.Sub(tr.deadline))
		}
	}
	t.Logf("loss margin under load: trials=%d load=%s..%s session-lost{%s} lock-ended{%s} done-seen{%s} deletion-after-ended{%s} deletion-after-deadline{%s} read-after-done{%s} ended-past-expiry=%d proved-before=%d proved-after=%d",
		len(lost), load0, load1, quantiles(lost), quantiles(ended), quantiles(seen), quantiles(gap), quantiles(etcdGap), quantiles(read), pastExpiry, before, after)
	if len(lost) >= 200 && pastExpiry*100 > len(lost) {
		t.Errorf("%d of %d locks ended more than the loss margin %v after the local deadline, past etcd's earliest expiry; want at most 1%%",
			pastExpiry, len(lost), shortTTL/20)
	}
}

// quantiles gives min, p50, p99 and max of ds.
func quantiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	q := func(p float64) time.Duration { return ds[int(p*float64(len(ds)-1))] }
	r := func(d time.Duration) string { return d.Round(100 * time.Microsecond).String() }
	return fmt.Sprintf("min=%s p50=%s p99=%s max=%s", r(ds[0]), r(q(0.5)), r(q(0.99)), r(ds[len(ds)-1]))
}
