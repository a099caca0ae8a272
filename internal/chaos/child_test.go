package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/exampleenv"
	"github.com/leasefence/leasefence/internal/seam"
	"github.com/leasefence/leasefence/lease"
)

// A child process is this test binary run again by exampleenv.StartChild,
// which sets childEnv to the role: a lock holder that the test can really
// stop (SIGSTOP) and kill (SIGKILL). TestMain must see the same variable,
// or the child would run the whole suite again, children and all.
const (
	childEnv     = exampleenv.ChildEnv
	envEndpoints = "CHAOS_ENDPOINTS"
	envLock      = "CHAOS_LOCK"
	envRegister  = "CHAOS_REGISTER"
	envTTL       = "CHAOS_TTL"
	envMutant    = "CHAOS_MUTANT" // the parent's mutant, so the child's library has it too
)

// runChild is the child's main. Role "holder" takes the lock and then
// waits for stdin to close; role "writer" also writes the register in a
// loop, fenced by its token, printing "S n" before and "W n outcome" after
// each write, until stdin closes.
func runChild(role string) int {
	if err := child(role, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

func child(role string, in io.Reader, out io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ttl, err := time.ParseDuration(os.Getenv(envTTL))
	if err != nil {
		return err
	}
	if m, err := strconv.Atoi(os.Getenv(envMutant)); err == nil {
		ctx = seam.With(ctx, &seam.Hooks{Mutant: seam.Mutant(m)})
	}
	cli, err := etcdproc.NewClient(strings.Split(os.Getenv(envEndpoints), ","))
	if err != nil {
		return err
	}
	defer cli.Close()
	s, err := newSession(ctx, cli, lease.WithTTL(ttl))
	if err != nil {
		return err
	}
	defer s.Close()
	l, err := s.Lock(ctx, os.Getenv(envLock))
	if err != nil {
		return err
	}
	w := &lineWriter{w: out}
	// The key and lease first, for the parent's lock oracle, which takes
	// the grant as reported at the LOCKED line.
	w.printf("KEY %s %x", l.Key(), int64(s.Lease()))
	w.printf("LOCKED %d", l.Token())
	go func() { // ends with the process
		<-l.Done()
		w.printf("LOST %v", l.Err())
	}()
	stdinClosed := make(chan struct{})
	go func() {
		io.Copy(io.Discard, bufio.NewReader(in))
		close(stdinClosed)
	}()
	if role != "writer" {
		<-stdinClosed
		return nil
	}
	reg := os.Getenv(envRegister)
	for n := 1; ; n++ {
		select {
		case <-stdinClosed:
			return nil
		default:
		}
		w.printf("S %d", n)
		wctx, stop := context.WithTimeout(ctx, 2*time.Second)
		_, err := fence.NewTxn(wctx, seam.KV(wctx, cli), fence.Resource(reg+".fence", l.Token())).
			Then(clientv3.OpPut(reg, fmt.Sprintf("child-t%d-%d", l.Token(), n))).Commit()
		stop()
		switch {
		case err == nil:
			w.printf("W %d ok", n)
		case errors.Is(err, fence.ErrStale):
			w.printf("W %d refused", n)
		default:
			w.printf("W %d unknown", n)
		}
		time.Sleep(10 * time.Millisecond) // pacing of the workload, not synchronisation
	}
}

type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, format+"\n", args...)
}
