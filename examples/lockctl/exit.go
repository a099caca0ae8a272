package main

import "fmt"

// Exit statuses. A cron job or a CI step tells "someone else holds the
// lock" (busy) from a failure, as with flock -E; the numbers follow
// sysexits.h, timeout(1) and the shells, so that they mean what a script
// author already expects.
const (
	exitOK          = 0   // done; for run, the child's own status
	exitFailed      = 1   // anything else went wrong
	exitUsage       = 2   // bad arguments
	exitStale       = 3   // put: the token is lower than the record's
	exitUnknown     = 4   // put: no answer; the write may have landed
	exitUnverified  = 5   // put: etcd did not confirm the token as a holding of the lock
	exitUnavailable = 69  // EX_UNAVAILABLE: etcd did not answer in time
	exitBusy        = 75  // EX_TEMPFAIL: run -no-wait or -wait found the lock held
	exitLost        = 124 // the holding was lost, while the child ran (as timeout(1)) or before it started
	exitNoExec      = 126 // the command was found but could not be run, as shells do
	exitNotFound    = 127 // the command was not found, as shells do
	exitSignal      = 128 // plus N: the child, or lockctl while waiting, got signal N
)

// exitError ends lockctl with code, printing err (if any) to stderr.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

func exitWith(code int, err error) error { return &exitError{code: code, err: err} }
