// Package chaos is the fault suite: it runs locks and fenced writes
// against real etcd servers while injecting real faults (etcd's fault
// proxy, SIGSTOP and SIGKILL of child processes, stopped cluster members,
// compaction, a slow or fast local clock), records every operation in a
// history, and checks each history with porcupine against a model of a
// fenced register. An unfenced control runs the same chaos with writes that
// skip the fence; the checker must catch it, or the suite proves nothing.
//
// The fast tier runs with go test ./...; set LEASEFENCE_CHAOS_RUNS to a
// number of chaos runs for the long tier. Each tier prints one summary line.
//
// This package's non-test code is the model and the history recorder.
package chaos
