// Package chaos is leasefence's fault suite: evidence that fenced writes
// never lose, under every fault this machine can inject, and that unfenced
// ones do.
//
// Everything runs against real etcd servers on loopback ports: the shared
// embedded member (with a 500 ms election timeout, so that etcd grants
// 1-second leases), embedded three-member clusters, and clusters of real
// etcd processes built from the server module; the chaos tiers' manifest
// registers live on a real versitygw S3 gateway (internal/s3test), one per
// tier with a bucket per run. Faults are real too: etcd's
// fault proxy in front of each client (pause, delay, blackhole), SIGSTOP,
// SIGCONT and SIGKILL of child processes (this test binary run again),
// stopped and killed members, a blackholed peer port, members behind
// links that delay every byte as a wire does, cut and slowed mid-run
// (internal/chaos/rttlab), compaction with defragmentation, and the
// library's local clock run at half or double speed (lease.WithClockRate,
// which exists only under the build tag leasefence_mutants; without the
// tag the clock fault kinds are left out).
// Every loop is bounded.
//
// # What runs
//
//   - TestScenario*: the fixed scenarios, each with its expected outcome:
//     token identity, a SIGSTOPped holder, a transaction held in the proxy
//     while its lease expires, token reuse in one process, Unlock after
//     loss, local loss before etcd's expiry under latency, ambiguous
//     commits, waiters whose session or key ends, leader stopped or killed
//     while a lock is held and written, a minority member cut off with the
//     holder's client on it, and takeover time after SIGKILL.
//   - TestChaos: randomized runs of 8 to 16 clients over two lock names,
//     each with four registers (Held-guarded etcd key, Resource-guarded
//     etcd key, sqlfence-guarded SQLite row, and an S3 manifest object
//     committed through objectfence: a write is a Claim with the client's
//     token, recorded as an operation of its own that raises the token and
//     keeps the value, then a Commit of the value on what the claim
//     returned; a read is Read's payload). Clients
//     acquire, write, read and release at random; one of them is paused
//     (its traffic held or dropped) until etcd has expired its lease and a
//     successor has written (then for up to a second more, until successors
//     have written each of the name's registers), then writes every register
//     with its old token. Each run has one fault kind on top, cycling
//     through all of them (LEASEFENCE_CHAOS_FAULTS picks some). One of
//     them, lostanswers, loses the answers of a fraction of the writes
//     each client's sessions send, after etcd applied them, or sends
//     them 50 to 500 ms late, after the caller gave up: a gRPC
//     interceptor in the sessions' etcd client (holdback.Losses), the
//     one cut that can drop one answer and keep the connection. Every
//     history is checked with porcupine against a fenced-register model
//     (Model); Unknown from the checker fails; a
//     run whose pause did not end in an expiry and a successor's write is
//     counted invalid, not passed. A manifest commit is unknown only when
//     objectfence says so (fence.ErrOutcomeUnknown); its other errors are
//     held to having written nothing. The unfenced control then runs the
//     same chaos with writes that skip the fence (plain puts of the etcd
//     keys and of the manifest object, in objectfence's own form, a plain
//     upsert of the row), and the checker must find violations, on the
//     manifest registers alone too. Clients take their locks with Lock
//     mostly, and sometimes RLock (then only reading), TryLock or TryRLock.
//     In two runs of four (not latency runs) every session waits out a
//     1 s lock delay after a loss (lease.WithLockDelay). The mutant scenario 10 and the
//     flapping scenario use the first three registers only.
//   - The lock oracle (oracle.go), in every chaos run and the flapping
//     scenario: a watch opened before the clients start records every
//     change under the run's lock names, and each grant a client received
//     is checked against it: valid only if, at some revision between its
//     token and a linearizable read made after Lock returned, its own key
//     existed with its token on its session's lease and no older key that
//     blocks it did (any key blocks a writer, only a writer's a reader).
//     A history with a gap (a watch reopened past a compaction) makes the
//     run inconclusive, counted, never passed. Its controls: every grant
//     that had to wait is forged as decided at its own put and must be
//     found invalid; scenario 12 (a waiter granted after its key was
//     deleted, which only the oracle looks at) catches SessionOnlyOwnership.
//   - The liveness oracle (liveness.go), in every chaos run: from the same
//     history, each event dated by when it reached the recorder, and every
//     Lock, RLock, TryLock and TryRLock call the clients made (when it was
//     called and returned, and how), it finds each waiter's turn: the
//     first revision at which its own key existed on its lease and no
//     older key that blocks it remained (a key moved off its lease blocks
//     nothing), moved to the end of a lock delay if a loss preceded it.
//     Such a waiter must be granted, or its call return, by the later of
//     its turn and the heal of the faults on its client, plus a bound
//     derived from the library's backoffs and etcd's catch-up
//     (LivenessBound: 1.95 s on loopback). A waiter past it is a stuck
//     waiter and fails the tier, named with the keys it was behind. A
//     call that cannot be placed in the history makes the run
//     inconclusive, counted, never passed. Scenario 13 (a holder and
//     three waiters queued behind it, handing on) catches DroppedWake.
//   - The end-of-run checks (lostanswers_test.go), in every chaos run:
//     once each client let go of its holdings and every late write
//     landed, with each client's last session still open, no key under
//     a run lock name may lie on a live lease (after waiting up to the
//     TTL + 1 s for keys of ended sessions to go), every live session
//     must take every name with TryLock (ErrKeyInUse, or a refusal with
//     no holder, is a stranded name), and no lock may have ended with
//     ErrKeyDeleted while etcd still knew its lease (a stray delete of
//     its own session's, such as a withdrawal applied late). Each
//     finding names its key, with the key's story from the oracle's
//     history. The control: a key planted at a live session's own path,
//     outside the library, must be reported as both.
//   - TestMutantsAreCaught (build tag leasefence_mutants): deliberate bugs
//     (fence comparison removed, lease ID or header revision as token,
//     unguarded Unlock, ownership from Session.Done alone, requested TTL
//     instead of granted, a wake-up dropped); each must be caught by a
//     named scenario. The last three live in package lease under the tag
//     (lease.WithMutant); the others are built around the library by
//     internal/seam.
//   - TestTLSAndAuth: the core against an etcd with TLS, client
//     certificates and authentication.
//
// # Tiers
//
// go test ./... runs the fast tier (each chaos fault kind once, two control
// runs, each scenario a few times). LEASEFENCE_CHAOS_RUNS=N selects the
// long tier: N fenced chaos runs, N/10 control runs, and more repetitions
// of each scenario, for example:
//
//	LEASEFENCE_CHAOS_RUNS=1000 go test -timeout 2h -run . ./internal/chaos
//
// Each tier prints a summary line (with -v, and appended to the file named
// by LEASEFENCE_CHAOS_SUMMARY if set): runs, faults by kind, operations,
// histories checked, stale writes accepted (must be 0), control violations
// found (must be above 0), and by register kind (the control runs whose
// registers of that kind alone are illegal; the manifest's must be above
// 0), invalid runs, grants checked by the lock oracle, invalid grants
// (must be 0), runs whose oracle was inconclusive, the forged early grants
// flagged of those forged (all, and above 0), the waiters whose turn came
// that the liveness oracle checked (above 0), the stuck ones (must be 0)
// and the runs it could not check in full, and the manifest operations
// of the fenced and the control runs by outcome, with the victims' late
// manifest writes and how many were refused and accepted (fenced: some
// tried, none accepted), and the end-of-run checks' findings: orphan
// keys, stranded names, holdings deleted under a live lease (each must
// be 0), the planted keys flagged of those planted (all, and above 0),
// and what the lostanswers runs did (answers lost, writes sent late). A
// failing run writes its history
// (JSON) and porcupine's HTML visualization to a new folder under
// LEASEFENCE_CHAOS_DIR (default: the system's temporary directory) and
// prints the path.
//
// This package's non-test code is the model, the history recorder, the
// lock oracle (with each key's story, for reports) and the liveness
// oracle.
package chaos
