package netlab

import (
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func lab(t *testing.T) (*Lab, context.Context) {
	t.Helper()
	skipUnlessAvailable(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	l, err := New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
		if leftover := namespaces(t, l.id); len(leftover) > 0 {
			t.Errorf("namespaces left after Close: %v", leftover)
		}
	})
	return l, ctx
}

// skipUnlessAvailable skips where labs cannot be built, except in CI,
// which runs as root and must run these tests.
func skipUnlessAvailable(t *testing.T) {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

func namespaces(t *testing.T, prefix string) []string {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		if name, _, _ := strings.Cut(line, " "); strings.HasPrefix(name, prefix) {
			names = append(names, name)
		}
	}
	return names
}

// echo serves one byte back on every connection to ln.
func echo(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			io.CopyN(c, c, 1)
		}()
	}
}

// reaches tells whether from gets an answer from addr within d.
func reaches(ctx context.Context, from *Host, addr string, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	c, err := from.DialContext(ctx, addr)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte{1}); err != nil {
		return false
	}
	_, err = c.Read(make([]byte, 1))
	return err == nil
}

// pair is a lab of two hosts, a and b, with an echo server on b at addr.
func pair(t *testing.T) (l *Lab, ctx context.Context, a, b *Host, addr string) {
	t.Helper()
	l, ctx = lab(t)
	var err error
	if a, err = l.AddHost(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if b, err = l.AddHost(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	addr = b.IP + ":7000"
	ln, err := b.Listen(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go echo(ln) // ends when ln closes
	return l, ctx, a, b, addr
}

func TestCutDropHeal(t *testing.T) {
	l, ctx, a, b, addr := pair(t)
	if !reaches(ctx, a, addr, 2*time.Second) {
		t.Fatal("a does not reach b on a healthy lab")
	}
	// The lab's addresses exist only inside its namespaces (checked
	// without sending anything from the machine's own namespace, whose
	// default route would carry it off the machine).
	if out, err := exec.Command("ip", "-br", "addr").Output(); err != nil || strings.Contains(string(out), "10.213.0.") {
		t.Fatalf("the machine's own namespace has a lab address (err %v):\n%s", err, out)
	}
	if err := l.Cut(ctx, a, b); err != nil {
		t.Fatal(err)
	}
	if reaches(ctx, a, addr, 500*time.Millisecond) {
		t.Fatal("a reaches b across a cut")
	}
	if err := l.Heal(ctx, a, b); err != nil {
		t.Fatal(err)
	}
	if !reaches(ctx, a, addr, 2*time.Second) {
		t.Fatal("a does not reach b after the heal")
	}
	// One direction only: b to a cut leaves a's SYN arriving, but b's
	// answer is dropped.
	if err := l.Cut(ctx, b, a); err != nil {
		t.Fatal(err)
	}
	if reaches(ctx, a, addr, 500*time.Millisecond) {
		t.Fatal("a gets b's answer across a cut of b to a")
	}
	if err := l.HealAll(ctx); err != nil {
		t.Fatal(err)
	}
	// A share: with 100% dropped nothing passes, with 0% everything.
	if err := l.Drop(ctx, a, b, 100); err != nil {
		t.Fatal(err)
	}
	if reaches(ctx, a, addr, 500*time.Millisecond) {
		t.Fatal("a reaches b with every packet dropped")
	}
	if err := l.Drop(ctx, a, b, 0); err != nil {
		t.Fatal(err)
	}
	if !reaches(ctx, a, addr, 2*time.Second) {
		t.Fatal("a does not reach b once nothing is dropped")
	}
}

func TestDropShare(t *testing.T) {
	l, ctx, a, b, addr := pair(t)
	if err := l.Drop(ctx, a, b, 50); err != nil {
		t.Fatal(err)
	}
	// A connection needs a SYN and the byte through; with half the packets
	// dropped, short attempts fail often and succeed often.
	ok := 0
	const tries = 40
	for i := 0; i < tries; i++ {
		if reaches(ctx, a, addr, 150*time.Millisecond) {
			ok++
		}
	}
	t.Logf("%d of %d short attempts got through with 50%% dropped", ok, tries)
	if ok == 0 || ok == tries {
		t.Fatalf("%d of %d attempts got through: the share is not applied", ok, tries)
	}
}

func TestLeftoversOfDeadRunsRemoved(t *testing.T) {
	skipUnlessAvailable(t)
	// A namespace named as a run of a process that cannot exist.
	name := Prefix + "999999999-1-sw"
	if err := run(context.Background(), []string{"ip", "netns", "add", name}); err != nil {
		t.Fatal(err)
	}
	l, _ := lab(t)
	if left := namespaces(t, name); len(left) != 0 {
		run(context.Background(), []string{"ip", "netns", "del", name})
		t.Fatalf("leftover %v not removed by New", left)
	}
	if own := namespaces(t, l.id); len(own) != 1 {
		t.Fatalf("the new lab's own namespaces: %v", own)
	}
}
