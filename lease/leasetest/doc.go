// Package leasetest runs a real etcd for the tests of code that uses
// package lease: an embedded single member on free loopback ports, quiet,
// stopped and removed when the test ends, and the faults that lock-holding
// code must survive: a client whose traffic can be held, dropped or
// delayed (etcd's fault proxy), a session's lease revoked, a lock key
// deleted, the server stopped and restarted.
//
// # What is guaranteed
//
//   - NewServer returns a serving member (ready in about a second) or fails
//     the test; everything it and Client start is closed by the test's
//     cleanups, and leaves no goroutine behind.
//   - Traffic stays on the loopback interface.
//   - The server is etcd itself (go.etcd.io/etcd/server/v3), not a fake:
//     revisions, leases, watches and transactions behave as in production.
//
// # What is not
//
// One member only: leader changes and partitions between members are not
// modelled. The server uses etcd's default timing unless
// WithElectionTimeout says otherwise, so the shortest lease is 2 s by
// default. Importing this package brings etcd's
// server into the test binary; the library packages never import it.
package leasetest
