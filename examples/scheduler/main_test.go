package main

import (
	"bytes"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/exampleenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(exampleenv.ChildEnv) == "scheduler" {
		if err := scheduler(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, os.Getenv(envID)+":", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestScheduler(t *testing.T) {
	const ttl = 2 * time.Second
	var out bytes.Buffer
	rep, err := run("", ttl, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if !rep.refused {
		t.Error("the resumed leader's write was not refused")
	}
	// A standby takes over once the stopped or killed leader's lease
	// expires: within the TTL plus etcd's expiry sweep and a margin.
	for what, d := range map[string]time.Duration{"SIGSTOP": rep.takeoverStop, "SIGKILL": rep.takeoverKill} {
		if d <= 0 || d > ttl+2*time.Second {
			t.Errorf("takeover after %s took %v", what, d)
		}
	}
	if len(rep.checkpoints) < 6 {
		t.Fatalf("only %d checkpoints written", len(rep.checkpoints))
	}
	for i, cp := range rep.checkpoints {
		if cp != int64(i+1) {
			t.Fatalf("checkpoint %d is %d: %v", i, cp, rep.checkpoints)
		}
	}
}
