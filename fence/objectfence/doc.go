// Package objectfence fences the commits of a manifest object in an object
// store with the tokens of one lock, so that a writer whose lock has
// passed on cannot make its data visible, and no commit replaces a
// manifest its writer has not seen.
//
// Object stores, like S3, compare no numbers; they can only put an object
// on the condition that its current version (its ETag) is a given one, or
// that it is absent. A Fence builds the fence from that, on any store that
// honours those conditions (Check proves it does).
//
// The pattern is the one table formats use: data objects go under keys no
// other writer uses (DataKey puts the token in the key) and become visible
// only through the manifest that names them; a reader reads the manifest,
// then the objects it names. Orphans lists the data objects of writers
// that can no longer commit, for cleanup.
//
// # A holding: Claim, then Commit on what it returned
//
// A Fence is made for one manifest and one lock name (New). A new holder
// of the lock starts with Claim, with its token: from then on the
// manifest accepts no lower token, and Claim returns it as it is. Each
// Commit names its base, the Manifest that the holder's Claim or its
// previous Commit returned, and returns the base of the next:
//
//	base, err := f.Claim(ctx, lock.Token())
//	...
//	base, err = f.Commit(ctx, base, payload)
//
// A Manifest from Read is no base. Without the claim, the manifest would
// still accept the previous holder's token, and a commit the previous
// holder had in flight could land after the read: a commit built on what
// was read would then replace it unseen.
//
// After a Commit fails, the holder claims again with the same token. That
// returns the manifest as it is, with the holder's own commit in it if
// that commit landed after all, and writes nothing when the manifest
// already has the token; or a *fence.StaleError if a newer holder has
// taken over.
//
// # Guaranteed
//
// Provided every writer of the manifest goes through a Fence and the store
// honours conditional puts:
//
//   - A Commit lands only on its base: if anything was written to the
//     manifest since the Claim or Commit that returned the base, nothing is
//     written. The error is then a *fence.StaleError if a higher token has
//     claimed or committed, one wrapping ErrOtherLock if another lock
//     fences it now, and one wrapping ErrNotClaimed otherwise
//     (another commit of the same holding, say). Of several commits on one
//     base, at most one lands. A Commit on a Manifest from Read, or on one
//     whose Token, Lock or Version the caller changed, is refused before
//     anything is sent, with an error wrapping ErrNotClaimed: a commit
//     writes the token and lock its base was returned with, and nothing
//     else.
//   - A Claim or Commit whose token is lower than one the manifest has
//     accepted never lands. It fails with a *fence.StaleError naming both
//     tokens. An equal token passes: one holder claims once and commits
//     many times.
//   - The manifest records the name of the lock that fences it. A Claim
//     or Commit through a Fence of another lock name is refused with an
//     error wrapping ErrOtherLock, and writes nothing; Orphans lists
//     nothing then, with the same error. A manifest written by an earlier
//     version of this package, which recorded no name, is read as it is,
//     and its first Claim records the name.
//   - The store is checked before a Fence's first write (Check): a store
//     that writes a put whose If-Match or If-None-Match: * does not hold,
//     or whose versions do not tell two contents apart, is refused with
//     ErrConditionsIgnored, and nothing is committed through it. Some S3
//     emulators ignore these headers.
//   - A write whose outcome is unknown (no answer, a timeout, a 5xx) gives
//     an error wrapping fence.ErrOutcomeUnknown and is never retried, by
//     the Fence or, through NewS3Store, by the S3 client's own retryer
//     (turned off on each of the Fence's conditional puts, whatever
//     options the *s3.Client was made with; its reads and deletes keep
//     the client's retries, which are safe for them): claim again before
//     going on. A Commit
//     that finds its own payload landed after all returns it as success.
//   - Bad input (a nil store, an empty key, bucket or lock name, a token
//     below 1, a Commit on a Manifest that Claim or Commit did not return
//     for this manifest key and lock name) is refused with an error
//     wrapping fence.ErrInvalidArgument before anything is sent. The check
//     compares the key and the lock name only: a Manifest of the same key
//     and lock name from another store is not told apart.
//
// # Not guaranteed
//
// A store whose conditional puts are not atomic with the read of the
// version they compare (a gateway over a shared file system mounted
// without locking, say) can pass the check and still let two writers
// through. The Fence cannot tell which lock a token comes from: the
// tokens passed to Claim must be those of the lock named in New. A data
// object written under a token is visible to anyone who lists the data
// prefix; only the manifest says which objects are committed. Orphans
// reads the manifest as it is when called: a referenced function built
// from an older manifest can report as orphans objects that a newer one
// names. Restoring the manifest object from a backup, or writing it by
// other means, brings back a version an old holder may still have as its
// base, and that holder's commit could land on it. An S3Client that is
// not an *s3.Client must pass each request's options on to it, or its
// own retries can re-send a put whose answer was lost.
//
// NewS3Store adapts an S3 client (github.com/aws/aws-sdk-go-v2/service/s3)
// to the Store interface; other stores plug in by implementing Store.
package objectfence
