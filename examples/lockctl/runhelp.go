package main

import (
	"fmt"
	"io"
)

// writeRunHelp is lockctl run -h's more: what run promises, what the
// command gets, and the exit statuses.
func writeRunHelp(w io.Writer) {
	fmt.Fprint(w, `
lockctl run [flags] NAME -- COMMAND [ARGS...]

run takes lock NAME (waiting for it unless -wait or -no-wait says
otherwise), starts COMMAND directly (no shell: give sh -c '...' for one) in
a process group of its own, with stdin, stdout and stderr passed through,
and holds the lock until COMMAND and every process left in its group have
exited. It then releases the lock, only if its key is still the one it
created, and exits with COMMAND's status.

COMMAND's environment has the holding:
  LEASEFENCE_LOCK       the lock name NAME
  LEASEFENCE_KEY        the lock's key in etcd
  LEASEFENCE_TOKEN      the fencing token: the key's creation revision
  LEASEFENCE_LEASE      the session's lease ID, in hex as etcdctl prints it
  LEASEFENCE_ENDPOINTS  the etcd endpoints, comma-separated
  LEASEFENCE_RECORD     run's -record, if given, for lockctl put
  ETCD_LOCK_KEY         as LEASEFENCE_KEY, for scripts written for etcdctl lock
  ETCD_LOCK_REV         as LEASEFENCE_TOKEN: here the key's creation
                        revision, a fencing token (etcdctl lock passes its
                        response's revision, which is not one)

Signals INT, TERM, HUP and QUIT sent to lockctl go to COMMAND's group. A
signal while waiting ends the wait with 128 + the signal's number, and
COMMAND does not run.

Ctrl-Z (or SIGTSTP sent to lockctl) suspends COMMAND's group and lockctl
with it, as a shell's job, and fg or bg (SIGCONT sent to lockctl) resumes
both. The lock stays held only while lockctl renews it: a suspend longer
than -ttl loses it, and once resumed, lockctl acts on the loss as below.

If the lock is lost while COMMAND runs (the lease expired or was revoked,
the key was deleted), run sends SIGTERM (and SIGCONT) to COMMAND's group at
once, SIGKILL -kill-after later, and exits 124 when the group is gone, or
2s after SIGKILL if what is left in it outlasts SIGKILL (a zombie whose
parent left the group, a process stuck in the kernel): the message names
it. A loss before COMMAND starts (while run waits out a lock delay) exits
124 as well, with the same message, and COMMAND does not run. It
learns of the loss no later than etcd expires the lease, except when the
lease is revoked while run is cut off from etcd: then at its own deadline,
up to -ttl later. So every run holds the lock with a lock delay: a
holding asks whoever follows it, if it is lost, to wait -ttl (as etcd
granted it) + -kill-after + 1s, or -lock-delay if longer, after learning
of the loss, and every run waits the longer of that and its own. Runs on
NAME with different -ttl, -kill-after and -lock-delay are safe together:
a lost holder's command is stopped before the next one starts, as long as
the lost holder's lockctl runs. A loss older than the delay its holding
asked delays nothing. Not promised: a lockctl that is itself
paused (SIGSTOP, a frozen VM) cannot stop its command, and processes that
left the group (setsid, daemons) are not stopped; run them in a cgroup
(systemd-run --scope) if they must be. Then only a fence protects the
data: give the token to every write (lockctl put, the HTTP or SQL fence).

While it waits, run prints to stderr one line when it starts waiting
(behind which key, its owner and token, how many ahead) and one when it
waits out a lock delay (which token was lost, about how long is left);
-q prints neither, -v adds the grant, the command's start and the release.
lockctl show and list mark a holder that waits out a delay.

Exit status of run:
  COMMAND's     0 to 255; 128 + N if signal N killed COMMAND
  75            -no-wait or -wait: the lock is held (EX_TEMPFAIL, as flock -E)
  124           the lock was lost: while COMMAND ran (as timeout(1)), or
                before it started, and then it did not run
  126           COMMAND could not be run
  127           COMMAND was not found
  128 + N       signal N reached lockctl while it waited
  69            etcd did not answer (EX_UNAVAILABLE)
  1, 2          other failures; bad arguments
A COMMAND that exits 75 or 124 itself passes that status through: a script
that must tell them apart should not use them.
`)
}
