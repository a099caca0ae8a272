// Package rttlab gives tests and benchmarks links with a chosen latency,
// for figures that a deployment's round trips decide rather than
// loopback's. A Link forwards TCP connections from a loopback port to a
// target and delays each direction as a wire does: every chunk is written
// at its arrival time plus the delay (plus jitter, order kept), however
// busy the link is, unlike a proxy that sleeps after each read and so
// delays a busy link more. The kernels this runs on may lack sch_netem,
// hence a forwarder in user space.
//
// Precision: time.Sleep here wakes up to a millisecond late, so a writer
// sleeps with nanosleep on a thread of its own, short of the due time by
// its recent lateness, and spins the rest. On an idle machine a ping
// through a link pays the configured round trip within tens of
// microseconds; on a loaded one the scheduler adds its own delay, as it
// would to any real process.
//
// It is for figures that round trips decide, and for cutting a member's
// links; for pausing or blackholing one client's connection use
// etcdproc.Proxy, for partitions between hosts netlab, and for chosen
// messages held back internal/holdback.
package rttlab
