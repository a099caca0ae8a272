package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencestore"
)

// putArgs is what lockctl put is asked to write.
type putArgs struct {
	record, token string
	lock          string // the lock the token is a holding of
	unverified    bool   // -unverified: accept a token that is not confirmed
	key, value    string
}

var putCommand = command{
	name: "put", synopsis: "put [-record KEY] [-token T] [-lock NAME] KEY VALUE", arg: "KEY",
	about: "write VALUE at KEY only if token T is not below the fence record's (exit 3 if it is)",
	flags: func(fs *flag.FlagSet, inv *invocation) {
		fs.StringVar(&inv.put.record, "record", "", "the fence record `KEY`, which keeps the highest token accepted")
		fs.StringVar(&inv.put.token, "token", "", "the writer's fencing token `T`")
		fs.StringVar(&inv.put.lock, "lock", "", "the lock `NAME` whose holding T is, which etcd must confirm")
		fs.BoolVar(&inv.put.unverified, "unverified", false, "accept T above the record without asking etcd whether a holding of NAME has it")
	},
	args: putArgsOf,
	help: writePutHelp,
	run:  func(ctx context.Context, c *ctl, inv invocation) error { return c.put(ctx, inv.put) },
}

// putUsageErrorf is an error in put's arguments, with a hint to put's own
// help: put mostly runs in scripts under lockctl run, whose logs the
// usage text would fill.
func putUsageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...), hint: "lockctl put -h says what put needs."}
}

// putArgsOf checks put's flags and reads KEY VALUE.
func putArgsOf(inv *invocation, args []string) error {
	p := &inv.put
	if len(args) != 2 {
		return putUsageErrorf("put takes KEY VALUE (its flags go before KEY), got %d arguments", len(args))
	}
	p.key, p.value = args[0], args[1]
	if p.record == "" {
		p.record = os.Getenv("LEASEFENCE_RECORD")
	}
	if p.token == "" {
		p.token = os.Getenv("LEASEFENCE_TOKEN")
	}
	if p.lock == "" && !p.unverified {
		p.lock = os.Getenv("LEASEFENCE_LOCK")
	}
	token, err := strconv.ParseInt(p.token, 10, 64)
	switch {
	case p.key == "":
		return putUsageErrorf("put: empty KEY")
	case p.record == "":
		return putUsageErrorf("put needs -record KEY, or LEASEFENCE_RECORD (lockctl run -record sets it)")
	case p.record == p.key:
		return putUsageErrorf("put: KEY %q is the fence record itself", p.key)
	case p.token == "":
		return putUsageErrorf("put needs -token T, or LEASEFENCE_TOKEN (lockctl run sets it)")
	case err != nil || token <= 0:
		return putUsageErrorf("put: token %q: want a whole number above 0", p.token)
	}
	return putLockOf(p)
}

// putLockOf checks the lock put has etcd confirm the token against, or
// that -unverified was asked for instead.
func putLockOf(p *putArgs) error {
	switch {
	case p.lock == "" && !p.unverified:
		return putUsageErrorf("put needs -lock NAME, or LEASEFENCE_LOCK (lockctl run sets it), to have etcd confirm the token; -unverified skips that")
	case p.lock != "" && p.unverified:
		return putUsageErrorf("put: -lock and -unverified together: give one")
	}
	return nil
}

// put writes p.value at p.key, guarded by the fence record.
func (c *ctl) put(ctx context.Context, p putArgs) error {
	token, _ := strconv.ParseInt(p.token, 10, 64)
	rctx, cancel := c.request(ctx)
	defer cancel()
	if err := c.verify(rctx, p, token); err != nil {
		return err
	}
	_, err := fence.NewTxn(rctx, c.cli, fence.Resource(p.record, token)).Then(clientv3.OpPut(p.key, p.value)).Commit()
	var stale *fence.StaleError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &stale):
		return exitWith(exitStale, fmt.Errorf("put %s: token %d is stale: record %s has accepted %d; %s unchanged",
			p.key, token, p.record, stale.Highest, p.key))
	case errors.Is(err, fence.ErrOutcomeUnknown):
		return exitWith(exitUnknown, fmt.Errorf("put %s: %w; read %s back before trying again", p.key, err, p.key))
	}
	return fmt.Errorf("put %s: %w", p.key, err)
}

// verify has etcd confirm a token above the record's as the live holder's
// of p.lock before put raises the record to it. A token at or below the
// record's is left to the guarded write, which decides it as ever.
func (c *ctl) verify(ctx context.Context, p putArgs, token int64) error {
	if p.unverified {
		return nil
	}
	highest, err := fence.ReadRecord(ctx, c.cli, p.record)
	switch {
	case err != nil && unanswered(err):
		return exitWith(exitUnavailable, fmt.Errorf("put %s: %w; %s unchanged", p.key, err, p.key))
	case err != nil:
		return fmt.Errorf("put %s: %w", p.key, err)
	case token <= highest:
		return nil
	}
	v, err := fencestore.NewEtcdVerifier(c.cli)
	if err == nil {
		err = v.Verify(ctx, p.lock, token)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fence.ErrUnverified):
		return exitWith(exitUnverified, fmt.Errorf("put %s: %w; %s unchanged", p.key, err, p.key))
	case errors.Is(err, fencestore.ErrVerifierUnavailable) || unanswered(err):
		return exitWith(exitUnavailable, fmt.Errorf("put %s: %w; %s unchanged", p.key, err, p.key))
	}
	return fmt.Errorf("put %s: %w", p.key, err)
}

// writePutHelp is lockctl put -h's more.
func writePutHelp(w io.Writer) {
	fmt.Fprint(w, `
put writes one key in a transaction with the fence record: the write lands
only if T is at least the highest token the record has accepted, and the
record is raised to T in the same step. A command run by lockctl run gets
its token in LEASEFENCE_TOKEN, and with run -record the record in
LEASEFENCE_RECORD, so that put needs neither flag there. Give every writer
of the key the same record.

A token above the record's is first confirmed by etcd as the holder's of
the lock NAME (-lock, or LEASEFENCE_LOCK, which run sets): a key of NAME
with that creation revision on the lease its name encodes, with no older
key of the queue ahead of it. A token that is not the holder's (a typo, a
token of a lock other than NAME, a waiter's) is refused with exit 5 and
raises nothing; otherwise one wrong number would raise the record past
every token etcd will hand out for years. -unverified skips the check.

Exit status of put: 0 written, 3 stale token, 5 token not confirmed by
etcd (nothing changed in either case), 4 no answer (the write may have
landed: read it back), 69 etcd did not answer, 1 failed, 2 bad arguments.
`)
}
