// Package objectfence fences the commits of an object store's manifest
// with lock tokens, so that a writer whose lock has passed on cannot make
// its data visible.
//
// Object stores, like S3, compare no numbers; they can only put an object
// on the condition that its current version (its ETag) is a given one, or
// that it is absent. A Fence builds the token check from that: Commit
// reads the manifest, refuses if it holds a higher token, and puts the new
// manifest on the condition that it is still the one read. Any write in
// between changes the version and fails the put, which is retried from a
// new read only while the manifest's token stays at or below the caller's.
//
// The pattern is the one table formats use: data objects go under keys no
// other writer uses (DataKey puts the token in the key) and become visible
// only through the manifest that names them; a reader reads the manifest,
// then the objects it names. Orphans lists the data objects of writers
// that can no longer commit, for cleanup.
//
// # Resuming a holding: Claim
//
// A new holder that reads the manifest before its first commit must read
// it with Claim, which raises the manifest's token to its own. Without the
// claim, the manifest still accepts the previous holder's token until the
// new holder's first commit, so a commit the previous holder had in flight
// can land after the new holder's read, and the new holder then builds on
// a state that changed under it.
//
// # Guaranteed
//
//   - A commit or claim whose token is lower than one the manifest has
//     accepted never lands, provided every writer of the manifest goes
//     through a Fence and the store honours conditional puts. It fails with
//     a *fence.StaleError naming both tokens. An equal token passes: one
//     holder may commit many times.
//   - The store is checked before a Fence's first write (Check): a store
//     that writes a put whose If-Match or If-None-Match: * does not hold is
//     refused with ErrConditionsIgnored, and nothing is committed through
//     it. Some S3 emulators ignore these headers.
//   - A put whose outcome is unknown (no answer, a timeout, a 5xx) gives an
//     error wrapping fence.ErrOutcomeUnknown and is never retried, by the
//     Fence or, through NewS3Store, by the S3 client's own retryer,
//     whatever client is passed: read the manifest before trying again.
//   - Bad input (a nil store, an empty key or bucket, a token below 1) is
//     refused with an error wrapping fence.ErrInvalidArgument before
//     anything is sent.
//
// # Not guaranteed
//
// A store whose conditional puts are not atomic with the read of the
// version they compare (a gateway over a shared file system mounted
// without locking, say) can pass the check and still let two writers
// through. Tokens of different lock names are unrelated: fence a manifest
// with one lock name only. A data object written under a token is
// visible to anyone who lists the data prefix; only the manifest says
// which objects are committed.
//
// NewS3Store adapts an S3 client (github.com/aws/aws-sdk-go-v2/service/s3)
// to the Store interface; other stores plug in by implementing Store.
package objectfence
