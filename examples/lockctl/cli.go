package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// command is one of lockctl's commands, as the usage text lists it.
type command struct {
	name     string
	synopsis string // name, its flags and its argument
	arg      string // the argument's name in synopsis
	about    string
	// flags defines the command's own flags (given after its name) into
	// inv; nil if it has none.
	flags func(fs *flag.FlagSet, inv *invocation)
	// run runs it; nil for help, which needs no etcd.
	run func(ctx context.Context, c *ctl, inv invocation) error
	// args checks the arguments after the command's flags into inv; nil
	// for one argument named arg.
	args func(inv *invocation, args []string) error
	// help writes more about the command after the usage text, for
	// lockctl COMMAND -h; nil if there is no more to say.
	help func(w io.Writer)
}

// commands, in the order the usage text lists them.
var commands = []command{
	{name: "list", synopsis: "list PREFIX", arg: "PREFIX",
		about: "locks under PREFIX: each one's holder (token, lease, owner) and waiters",
		run:   func(ctx context.Context, c *ctl, inv invocation) error { return c.list(ctx, inv.arg) }},
	{name: "show", synopsis: "show NAME", arg: "NAME",
		about: "the whole queue of lock or election NAME, holder first, with owners",
		run:   func(ctx context.Context, c *ctl, inv invocation) error { return c.show(ctx, inv.arg) }},
	{name: "records", synopsis: "records [-all] PREFIX", arg: "PREFIX",
		about: "fence records under PREFIX with their highest token",
		flags: func(fs *flag.FlagSet, inv *invocation) {
			fs.BoolVar(&inv.all, "all", false, "also list the keys that are not fence records, and why; else only counted")
		},
		run: func(ctx context.Context, c *ctl, inv invocation) error { return c.records(ctx, inv.arg, inv.all) }},
	{name: "release", synopsis: "release -token T NAME", arg: "NAME",
		about: "delete the key of NAME's holder if its token is T; print an audit line",
		flags: func(fs *flag.FlagSet, inv *invocation) {
			fs.Int64Var(&inv.token, "token", 0, "the holder's token `T`, as list or show print it")
		},
		run: func(ctx context.Context, c *ctl, inv invocation) error { return c.release(ctx, inv.arg, inv.token) }},
	{name: "watch", synopsis: "watch NAME", arg: "NAME",
		about: "print each new holder of NAME, with its owner, until interrupted",
		run:   func(ctx context.Context, c *ctl, inv invocation) error { return c.watch(ctx, inv.arg) }},
	runCommand,
	putCommand,
	{name: "help", synopsis: "help", about: "print this text"},
}

// shownDefault is what the usage text gives as a flag's default where
// the flag's zero value would say nothing useful.
var shownDefault = map[string]string{
	"endpoints": "$" + envEndpoints + ", else " + defaultEndpoints,
	"token":     "none: required",
	// put's, which lockctl run's command finds in its environment.
	"put -token":  "$LEASEFENCE_TOKEN",
	"put -record": "$LEASEFENCE_RECORD",
	"put -lock":   "$LEASEFENCE_LOCK",
	// The session's own default, lease.WithOwner's.
	"run -owner": "host/pid",
}

// invocation is what the arguments ask for.
type invocation struct {
	cfg   config
	cmd   *command
	help  bool // print the usage text and nothing else
	arg   string
	token int64 // release's -token
	all   bool  // records' -all
	run   runFlags
	put   putArgs
}

// usageError is an error in the arguments: lockctl prints the usage text
// after it, or its hint, and exits with status 2.
type usageError struct {
	msg string
	// hint, if set, is printed after msg in place of the usage text: for
	// an error in a command's own arguments, which forty lines of usage
	// would bury.
	hint string
}

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// globalFlags defines the flags given before the command into cfg.
func globalFlags(cfg *config) *flag.FlagSet {
	fs := flag.NewFlagSet("lockctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // the usage text is ours, printed once
	fs.StringVar(&cfg.endpoints, "endpoints", "", "etcd client `URLs`, comma-separated")
	fs.StringVar(&cfg.cacert, "cacert", "", "verify the servers' certificates against the CA bundle in `FILE`")
	fs.StringVar(&cfg.cert, "cert", "", "present the client certificate in `FILE`")
	fs.StringVar(&cfg.key, "key", "", "the client certificate's key, in `FILE`")
	fs.StringVar(&cfg.user, "user", "", "etcd user, as `NAME` or NAME:PASSWORD")
	fs.StringVar(&cfg.password, "password", "", "etcd user's `PASSWORD`, if -user does not give it")
	fs.BoolVar(&cfg.json, "json", false, "print JSON for scripts (watch: one object per line)")
	fs.DurationVar(&cfg.timeout, "timeout", 5*time.Second, "wait up to `DURATION` for etcd to answer: to connect, then each request")
	return fs
}

// commandFlags defines cmd's own flags into inv.
func commandFlags(cmd *command, inv *invocation) *flag.FlagSet {
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if cmd.flags != nil {
		cmd.flags(fs, inv)
	}
	return fs
}

// parseArgs reads the command line (without the program's name).
func parseArgs(args []string) (invocation, error) {
	var inv invocation
	fs := globalFlags(&inv.cfg)
	if err := fs.Parse(args); err != nil {
		return helpOr(inv, err)
	}
	if inv.cfg.timeout <= 0 {
		// Every request would time out at once.
		return inv, usageErrorf("-timeout %v: want more than 0", inv.cfg.timeout)
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return inv, usageErrorf("no command")
	}
	inv.cmd = lookup(rest[0])
	if inv.cmd == nil {
		return inv, usageErrorf("unknown command %q", rest[0])
	}
	if inv.cmd.run == nil { // help
		inv.help = true
		return inv, nil
	}
	cfs := commandFlags(inv.cmd, &inv)
	if err := cfs.Parse(rest[1:]); err != nil {
		return helpOr(inv, fmt.Errorf("%s: %w", inv.cmd.name, err))
	}
	if inv.cmd.args != nil {
		return inv, inv.cmd.args(&inv, cfs.Args())
	}
	return inv, checkArgs(&inv, cfs.Args())
}

// helpOr turns a flag parse error into a usage error, unless it is a
// request for help (-h, -help).
func helpOr(inv invocation, err error) (invocation, error) {
	if errors.Is(err, flag.ErrHelp) {
		inv.help = true
		return inv, nil
	}
	return inv, &usageError{msg: err.Error()}
}

// checkArgs checks the arguments after the command's flags: one, not
// empty (an empty prefix would be the whole keyspace), and release's
// token.
func checkArgs(inv *invocation, args []string) error {
	switch {
	case len(args) != 1:
		return usageErrorf("%s takes one %s (its flags go before it), got %d arguments", inv.cmd.name, inv.cmd.arg, len(args))
	case args[0] == "":
		return usageErrorf("%s: empty %s", inv.cmd.name, inv.cmd.arg)
	case inv.cmd.name == "release" && inv.token <= 0:
		return usageErrorf("release needs -token T, T > 0: the holder's token, as list or show print it")
	}
	inv.arg = args[0]
	return nil
}

func lookup(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

// writeUsage writes the usage text: every command and every flag, with its
// default.
func writeUsage(w io.Writer) {
	fmt.Fprint(w, "usage: lockctl [flags] COMMAND [command flags] ARGUMENTS\n\n"+
		"lockctl shows and manages the locks of package lease, and of etcd's own\n"+
		"lock and election, which use the same keys.\n\nCommands:\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.synopsis, c.about)
	}
	tw.Flush()
	fmt.Fprint(w, "\nFlags, before the command:\n")
	writeFlags(w, "", globalFlags(&config{}))
	for i := range commands {
		if c := &commands[i]; c.flags != nil {
			fmt.Fprintf(w, "\nFlags of %s, after its name:\n", c.name)
			writeFlags(w, c.name, commandFlags(c, &invocation{}))
		}
	}
	fmt.Fprint(w, "\nrelease never deletes blindly: it deletes the holder's key only if its token\n"+
		"is still T, in one transaction, so a lock that changed hands is left alone.\n\n"+
		"run holds lock NAME while COMMAND runs and stops COMMAND if the lock is\n"+
		"lost; put writes a key only if a token is not stale (lockctl run -h says more).\n\n"+
		"Exit status: 0 done, 1 failed, 2 bad arguments, 69 etcd did not answer;\n"+
		"run and put have more (lockctl run -h, lockctl put -h).\n")
}

// writeFlags writes one line per flag of fs: name, argument, what it does
// and its default.
func writeFlags(w io.Writer, cmd string, fs *flag.FlagSet) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fs.VisitAll(func(f *flag.Flag) {
		arg, about := flag.UnquoteUsage(f)
		def, ok := shownDefault[cmd+" -"+f.Name]
		if !ok {
			def, ok = shownDefault[f.Name]
		}
		switch {
		case ok:
		case f.DefValue == "":
			def = "none"
		default:
			def = f.DefValue
		}
		fmt.Fprintf(tw, "  -%s %s\t%s (default %s)\n", f.Name, arg, about, def)
	})
	tw.Flush()
}
