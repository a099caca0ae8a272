package fenceotel

import "go.opentelemetry.io/otel/attribute"

// Attribute keys of the spans and metrics, in the leasefence namespace.
const (
	AttrLockName  = attribute.Key("leasefence.lock.name")  // the lock or election name
	AttrMode      = attribute.Key("leasefence.lock.mode")  // "write" or "read"
	AttrToken     = attribute.Key("leasefence.lock.token") // the fencing token granted, released or offered
	AttrOutcome   = attribute.Key("leasefence.lock.outcome")
	AttrAhead     = attribute.Key("leasefence.lock.queue.ahead")    // keys ahead when the call's key was queued
	AttrQueueTime = attribute.Key("leasefence.lock.queue.duration") // seconds from queued to the call's return
	AttrHeld      = attribute.Key("leasefence.lock.held.duration")  // seconds the holding lasted
	AttrCause     = attribute.Key("leasefence.lock.cause")          // why a holding ended: lease.Cause
	AttrFence     = attribute.Key("leasefence.fence.kind")          // "etcd", "sql", "object", "http" or "grpc"
	AttrGuard     = attribute.Key("leasefence.fence.guard")         // the kind of guard that refused, on the refusal metric
	AttrGuards    = attribute.Key("leasefence.fence.guards")        // each guard's kind
	AttrKeys      = attribute.Key("leasefence.fence.keys")          // each guard's key
	AttrTokens    = attribute.Key("leasefence.fence.tokens")        // each guard's token
	AttrVerdict   = attribute.Key("leasefence.fence.outcome")
	AttrHighest   = attribute.Key("leasefence.fence.highest") // the token a stale write met
	AttrErrorType = attribute.Key("error.type")
)
