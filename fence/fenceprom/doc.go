// Package fenceprom turns the hooks of packages lease and fence into
// Prometheus metrics, for a registry of the service's own: nothing is
// registered behind its back, and there is no global state.
//
//	m, err := fenceprom.New()
//	registry.MustRegister(m)
//	s, err := lease.NewSession(ctx, cli, lease.WithHooks(m.LeaseHooks()))
//	fence.NewTxn(ctx, cli, guards...).WithHooks(m.FenceHooks())
//	sqlfence.New(dialect, table, id, sqlfence.WithHooks(m.FenceHooks()))
//	fencehttp.NewMiddleware(store, ..., fencehttp.WithHooks(m.FenceHooks()))
//
// The series, with the lock name as the only label on lock series (mapped
// through WithNameLabel, since lock names can be unbounded):
//
//	leasefence_lock_held{name}                    gauge: holdings now (0 or 1 per lock)
//	leasefence_lock_waiting{name}                 gauge: waiters now
//	leasefence_lock_acquire_seconds{name}         histogram: time to take a lock
//	leasefence_lock_hold_seconds{name}            histogram: how long locks were held
//	leasefence_lock_lost_total{name,cause}        counter: losses by cause (expired, key_deleted, session_closed, revision_regressed)
//	leasefence_session_keepalive_margin_seconds   histogram: local deadline minus now at each renewal
//	leasefence_sessions_lost_total                counter: sessions whose lease was lost
//	leasefence_session_grant_unanswered_total     counter: reports of a lease grant etcd has not answered
//	leasefence_fence_refused_total{guard}         counter: writes refused (held, resource, sql, object, http, grpc)
//	leasefence_fence_outcome_unknown_total        counter: fenced writes with an unknown outcome
//
// The unanswered counter tells of an etcd that cannot be reached before
// any session exists, and with no logger: it counts each Hooks.Unanswered
// report, made 2 s into a NewSession (and so a Run or Lead) that etcd has
// not answered, and every 10 s after that.
//
// What it does not do: it counts what this process saw. A process that is
// paused sees nothing meanwhile; refusals are counted where the fence
// runs (in the writer for etcd and SQL fences, in the server for HTTP and
// gRPC).
package fenceprom
