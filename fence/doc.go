// Package fence makes writes safe under a lease-based lock: the resource
// checks the writer's token in the same atomic step as the write, so a
// holder that paused past its lease cannot overwrite its successor's work.
//
// # Which guard where
//
//   - State in the same etcd as the lock: Held. The write commits only if
//     the lock key still exists with the holder's token (its creation
//     revision) and on the lease its name encodes (etcd's layout,
//     name/<lease ID in hex>), checked by etcd when it applies the
//     transaction, not when the client sent it. HeldCmps are the same
//     comparisons, for a transaction built with clientv3's own Txn.
//   - A resource that may see tokens from writers that reached it by other
//     paths, or whose protection must outlive the lock (the lock key is
//     gone once released, so Held can no longer say anything): Resource. A
//     fence record in etcd keeps the highest token accepted; a write passes
//     only with a token at least that high, and raises it. A writer that
//     writes many times through one record keeps a Recorder for it: its
//     guards are Resource guards that, after its first write, cost about
//     what Held does.
//   - A new holder about to read what a record fences: Claim, in the
//     transaction of its first read. It raises the record to the holder's
//     token in the same atomic step as the read, so no earlier holder's
//     write can land after it. A plain read at the start of a holding is
//     not enough: the previous holder's last write may still be in flight,
//     and it passes the record until the new holder's first write raises
//     it.
//   - Rows in a SQL database: package fence/sqlfence, the same rule in one
//     UPDATE statement.
//
// ReadRecord and ReadRecords decode fence records for inspection; Hooks
// report refusals and unknown outcomes to metrics (package fenceprom).
//
// A Holder is *lease.Lock or *lease.Leadership, or, for services that lock
// with etcd's own concurrency package, FromMutex and FromElection.
//
// Guards combine: NewTxn(ctx, kv, Held(l), Resource(k1, t), Resource(k2, t))
// checks them all, with the caller's own If/Then/Else, in the same atomic
// step as the caller's writes. A failed guard is an error (*NotHeldError
// or *StaleError) and runs neither branch; a failed caller If is not, and
// runs Else, as etcd would.
//
// # What is guaranteed
//
// A write guarded by Held lands only while the lock is held by that very
// holding. A write guarded by Resource lands only if no higher token has
// been accepted by that record; once a Claim has committed, no write with a
// lower token lands through that record, and the claim's reads saw the
// state no such write can change any more. A key attached to a lease (a
// lock key) is never taken as a record: such a transaction is refused with
// ErrBadRecord and changes nothing, and a Txn without guards is refused as
// bad input. Records store tokens in a fixed-width,
// order-preserving encoding (EncodeToken), because etcd compares values as
// bytes. An answer that did not arrive is reported as ErrOutcomeUnknown, never
// as a failure, and such a transaction is never re-sent by this package; a
// transaction on a context that had already ended is not sent at all, and
// says so. A transaction larger than etcd accepts, once the guards' own
// operations are counted, is refused before sending, with
// ErrInvalidArgument. Every error matches a sentinel of this package or is
// one of its typed errors.
//
// # What is not
//
// Tokens compare only within one lock name: never fence one record with
// locks of different names. Restoring etcd from a snapshot can move
// revisions, and so tokens, backwards; restore with
// etcdutl snapshot restore --bump-revision N --mark-compacted, with N above
// any revision the cluster may have handed out. A fence protects only
// writes that go through it: a plain put to the same key bypasses it. A
// Resource or Claim guard orders the tokens it is given and does not ask
// where they came from: one wrong number raises its record past every
// token etcd will hand out for years. Where tokens arrive from outside
// (requests, scripts), have etcd confirm them first: fencestore's
// EtcdVerifier, which fencestore.EtcdStore, fencehttp and fencegrpc use,
// refuses a token no live holding of the lock has with ErrUnverified.
package fence
