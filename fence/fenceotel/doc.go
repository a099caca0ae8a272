// Package fenceotel turns the hooks of packages lease and fence into
// OpenTelemetry spans and metrics. It depends on the OpenTelemetry API
// only: the service brings the SDK and its exporters, and gives the
// providers with WithTracerProvider and WithMeterProvider (the global ones
// otherwise).
//
//	tel, err := fenceotel.New(fenceotel.WithTracerProvider(tp), fenceotel.WithMeterProvider(mp))
//	s, err := lease.NewSession(ctx, cli, lease.WithHooks(tel.LeaseHooks()))
//	fence.NewTxn(ctx, cli, guards...).WithHooks(tel.FenceHooks())
//	sqlfence.New(dialect, table, id, sqlfence.WithHooks(tel.FenceHooks()))
//	objectfence.New(store, key, lock, objectfence.WithHooks(tel.FenceHooks()))
//	fencehttp.NewMiddleware(store, ..., fencehttp.WithHooks(tel.FenceHooks()))
//	fencegrpc.NewChecker(store, ..., fencegrpc.WithHooks(tel.FenceHooks()))
//
// # Spans
//
// Each span is a child of the span in the context the call was given, so a
// request that waited for a lock, or whose write was refused, shows it in
// its own trace. Span names are the calls as written, with no lock name
// in them (names can carry IDs):
//
//	lease.Lock, lease.RLock, lease.TryLock, lease.TryRLock, lease.Campaign
//	    from the call to its grant or error. Attributes: leasefence.lock.name,
//	    .mode ("write", "read"), .outcome ("granted", "locked" for a TryLock
//	    that found the lock taken, "canceled", "deadline_exceeded", "lost",
//	    "session_closed", "invalid", "error"), .token when granted,
//	    .queue.ahead (keys ahead when the call's key was queued, counted from
//	    the first read of the queue) and .queue.duration (seconds from then to
//	    the return). A "queued" event marks the enqueue. Status Error for a
//	    failed call, except "locked".
//	lease.Unlock, lease.Resign
//	    each call, linked to the span of the call that took the holding. The
//	    one that released it has an "ended" event giving
//	    leasefence.lock.held.duration and leasefence.lock.cause; one that
//	    found the holding ended already has status Error.
//	lease.HoldingEnd
//	    a holding that ended any other way (lost, or its session closed): a
//	    span of its own, a new root linked to the span of the call that took
//	    it, with the cause and how long it was held. Status Error for a
//	    loss. Being a root, it is sampled by the sampler's rule for roots,
//	    not with the call it links to. No span stays open while a lock is
//	    held.
//	fence.Txn.Commit, sqlfence.Write, sqlfence.Claim, objectfence.Commit, objectfence.Claim
//	    a fenced write. Attributes: leasefence.fence.kind ("etcd", "sql",
//	    "object"), .guards, .keys and .tokens (one per guard), .outcome
//	    ("ok", "stale", "unverified", "not_held", "unknown", "invalid",
//	    "error"); a stale
//	    write also carries leasefence.lock.token (offered) and
//	    leasefence.fence.highest (the token it met). Status Error unless ok.
//
// fencehttp and fencegrpc make no span: they mark the server span that
// otelhttp or otelgrpc made (put those outside the fence) with the lock
// name, the token, leasefence.fence.outcome, and on a refusal a "refused"
// event and status Error.
//
// A call whose span is not recorded (sampled out, or no SDK) is not traced
// further: its releases and its holding's end make no spans either.
//
// To see the etcd requests a call makes as children of its span, trace
// the etcd client itself: give clientv3.Config.DialOptions
// grpc.WithStatsHandler(otelgrpc.NewClientHandler()). A lock call's put
// and its reads while it waits, an Unlock's delete and a fenced commit's
// transactions carry the span. Watches, which a session's locks share,
// and the removal of a key whose call failed, do not.
//
// # Metrics
//
// The same as package fence/fenceprom's, under OpenTelemetry's naming:
//
//	leasefence.lock.held                 up-down counter {lock}: holdings now
//	leasefence.lock.waiting              up-down counter {call}: waiters now
//	leasefence.lock.acquire.duration     histogram s: time to take a lock, waiting included
//	leasefence.lock.hold.duration        histogram s: how long locks were held
//	leasefence.lock.losses               counter {lock}: holdings ended other than by release, by leasefence.lock.cause
//	leasefence.session.keepalive.margin  histogram s: local deadline minus now at each renewal
//	leasefence.session.losses            counter {session}: sessions whose lease was lost
//	leasefence.session.grant.unanswered  counter {event}: reports of a lease grant etcd has not answered
//	leasefence.fence.refusals            counter {write}: writes refused, by leasefence.fence.guard
//	leasefence.fence.unknown_outcomes    counter {write}: fenced writes with an unknown outcome
//
// Lock metrics carry leasefence.lock.name, mapped by WithNameAttribute
// (which may leave it out): the number of series is the service's choice.
//
// What it does not do: it reports what this process saw. A paused process
// sees nothing meanwhile, and a refusal is reported where the fence runs
// (the writer for etcd, SQL and object stores, the server for HTTP and
// gRPC). The hooks of a session are one set: a service that wants both
// this package and fenceprom combines their hooks itself.
package fenceotel
