package lease

// Every request this package sends that changes etcd, with the guard that
// makes a late or repeated copy of it harmless and what the session does
// when it gets no answer. etcd's client re-sends a write only when it was
// never sent, but a write whose answer is lost may still be applied, even
// after later requests of the same session. A write whose late copy could
// change what another holding owns is a bug. docs/design.md has the same
// table; the write model (writes_model_test.go) loses, holds back and
// replays the lock key's writes against a real etcd.
//
// Session (session.go, internal/grant, internal/renew, owner.go):
//   - Grant of the session's lease. Guard: none needed; a late or repeated
//     grant makes a lease nobody keeps alive, with no key, gone after its
//     TTL. No answer: NewSession waits, reporting it, until ctx ends.
//   - Keep-alive of the lease. Guard: none needed; it only extends the
//     lease, by the TTL from its arrival, so a late one keeps the keys of
//     an ended session up to one TTL longer. No answer: the session ends
//     at its local deadline, counted from the last keep-alive sent.
//   - Owner record: put of OwnerKey(lease) on the lease. Guard: the lease;
//     a copy writes the same value, or fails once the lease is gone. No
//     answer: NewSession fails (WithOwner) or goes on without it.
//   - Revoke (Close). Guard: none needed; a copy finds no lease. No answer:
//     the lease expires after its TTL.
//
// Lock key and marker (lease/internal/keywrite, lock.go, release.go):
//   - Enqueue put (Lock, RLock, Campaign): put of the key, with the
//     marker, in one transaction. Guard: the key is absent and the
//     marker's mod revision is what the session last knew. No answer: the
//     marker is kept for the session's life and the put withdrawn.
//   - TryLock's put: as the enqueue put, if nothing is under the name.
//   - Withdrawal: the marker moved, and the key deleted if it is the
//     session's own put's (the marker, as read or in etcd's history at the
//     key's creation revision, was written with it). Guard: the marker's
//     mod revision and the key's creation revision as last found. No
//     answer, or etcd overloaded: retried with the same guard until
//     answered or the session ends. Refused outright (no permission) or
//     refused 8 times (the marker kept moving): given up; the key, if
//     any, stays until the session's next lock of the name or its end.
//   - Removal of a key the session's own late put left (found by a put):
//     the withdrawal's transaction, with its guard.
//   - Removal of a key at the lock's path on another lease or none (no
//     lock): delete. Guard: its creation revision as found. No answer: the
//     next put finds it again.
//   - Cleanup (a Lock that fails or is given up) and Unlock, Resign:
//     delete of the key, with the marker unless kept, and the lock-delay
//     record's release. Guard: the key's creation revision is the token.
//     No answer, or etcd overloaded: cleanup retries until the session
//     ends (refused outright, it gives up as the withdrawal does); Unlock returns
//     the error and the lock stays held, perhaps, until the own-key watch
//     sees the delete or Unlock is called again.
//   - Proclaim: put of the key's value. Guard: the creation revision is
//     the token and the key is on the session's lease; a late copy can set
//     an older value of the same holding, never touch another's. No
//     answer: the error is returned; the value is unknown.
//
// Lock-delay record (delay.go), at DelayRecordKey, outside every queue:
//   - Held: put of "held T". Guard: the key is the holding's (token and
//     lease) and the record's mod revision as read. No answer: read again.
//   - Loss: a grant of the delay's lease, then put of "lost T" on it.
//     Guard: the record's mod revision as read; an unanswered grant leaves
//     a lease with no key that expires by itself. No answer: read again.
//   - Release: put of "released T" inside the Unlock's transaction.
//   - Abandon: "held T" to "released T" in the cleanup's transaction.
//     Guard: the record's value is "held T".
//   - Move from the old place (name + "\x00lock-delay"): put at the new,
//     delete at the old. Guard: both mod revisions as read.
//
// Keys of the library's own (markers, lock-delay records) lie under
// ownKeyPrefix, which no lock name can start: no name's queue, nested
// names' included, ever holds one.
