package exampleenv

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ChildEnv is set in the environment of a child started by StartChild,
// with the role as its value. An example's main (and its test's TestMain)
// checks it first and runs the child's part.
const ChildEnv = "LEASEFENCE_EXAMPLE_CHILD"

// Child is the example's own binary re-run as a separate process, so that it
// can really be stopped (SIGSTOP) and killed (SIGKILL). Its stdout comes in
// line by line; its stderr is kept for errors.
type Child struct {
	Name string
	cmd  *exec.Cmd
	in   io.WriteCloser

	lines  chan string
	stderr bytes.Buffer
	waited chan struct{}
	err    error
	mu     sync.Mutex
}

// StartChild starts the running binary again with ChildEnv=role and env
// added to its environment. The child is killed when ctx ends.
func StartChild(ctx context.Context, name, role string, env ...string) (*Child, error) {
	return StartChildIn(ctx, nil, name, role, env...)
}

// StartChildIn is StartChild with the command prefix wrap (such as ip
// netns exec NS, which execs the binary in its place, so signals reach the
// child itself).
func StartChildIn(ctx context.Context, wrap []string, name, role string, env ...string) (*Child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	argv := append(append([]string{}, wrap...), exe)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(append(os.Environ(), ChildEnv+"="+role), env...)
	c := &Child{Name: name, cmd: cmd, lines: make(chan string, 64), waited: make(chan struct{})}
	cmd.Stderr = &lockedWriter{mu: &c.mu, w: &c.stderr}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if c.in, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		c.err = cmd.Wait()
		close(c.waited)
	}()
	return c, nil
}

// Lines delivers the child's stdout, line by line, for callers that follow
// several children at once instead of calling Expect.
func (c *Child) Lines() <-chan string { return c.lines }

// Quit closes the child's stdin, which the examples' children take as the
// sign to finish cleanly, and waits for it to exit; after within it is
// killed.
func (c *Child) Quit(within time.Duration) {
	c.in.Close()
	select {
	case <-c.waited:
	case <-time.After(within):
		c.Stop()
	}
}

// Pid is the child's process ID.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Expect waits for the child's next line starting with prefix, skipping
// others, and returns the rest of it.
func (c *Child) Expect(prefix string, within time.Duration) (string, error) {
	timeout := time.After(within)
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				return "", fmt.Errorf("%s exited before %q: %v\n%s", c.Name, prefix, c.Wait(), c.Stderr())
			}
			if rest, found := strings.CutPrefix(line, prefix); found {
				return strings.TrimSpace(rest), nil
			}
		case <-timeout:
			return "", fmt.Errorf("%s: no %q within %v\n%s", c.Name, prefix, within, c.Stderr())
		}
	}
}

// Send writes a line to the child's stdin.
func (c *Child) Send(line string) error {
	_, err := io.WriteString(c.in, line+"\n")
	return err
}

// Signal sends sig to the child.
func (c *Child) Signal(sig syscall.Signal) error { return c.cmd.Process.Signal(sig) }

// Wait waits for the child to exit, reading and dropping what it still
// prints, and returns its exit error.
func (c *Child) Wait() error {
	go func() {
		for range c.lines {
		}
	}()
	<-c.waited
	return c.err
}

// Stop kills the child if it still runs (resuming it first if it was
// stopped) and waits for it.
func (c *Child) Stop() {
	select {
	case <-c.waited:
		return
	default:
	}
	c.cmd.Process.Signal(syscall.SIGKILL)
	c.Wait()
}

// Stderr is what the child wrote to stderr so far.
func (c *Child) Stderr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stderr.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// PauseUntilExpired stops the child holding lockName with SIGSTOP and waits
// until etcd has expired its lease and deleted its lock key, telling tl.
func PauseUntilExpired(ctx context.Context, cli *clientv3.Client, child *Child, lockName string, tl *Timeline) error {
	// Watch the key before stopping the child, so its expiry is seen as it happens.
	resp, err := cli.Get(ctx, lockName+"/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		return fmt.Errorf("reading A's lock key: %v %v", resp, err)
	}
	aKey := string(resp.Kvs[0].Key)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	deleted := cli.Watch(wctx, aKey, clientv3.WithRev(resp.Header.Revision+1))
	if err := child.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	stoppedAt := time.Now()
	tl.Printf("A", "is paused: SIGSTOP (think GC pause, swapping, a stalled VM)")
	if err := AwaitDelete(deleted); err != nil {
		return err
	}
	tl.Printf("etcd", "A's lease expired %v after the pause: key %s deleted", time.Since(stoppedAt).Round(10*time.Millisecond), aKey)
	return nil
}
