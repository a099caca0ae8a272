package objectfence_test

import (
	"context"
	"errors"
	"log"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/objectfence"
	"github.com/leasefence/leasefence/lease"
)

// A writer that holds the lock of a table commits batches to its manifest
// in S3. It claims the manifest before it reads, writes each batch under
// a key of its own token, and commits a pointer to it on the manifest it
// claimed.
func Example() {
	ctx := context.Background()
	var l *lease.Lock     // held: session.Lock(ctx, "tables/orders")
	var client *s3.Client // s3.NewFromConfig(cfg), cfg from config.LoadDefaultConfig
	store, err := objectfence.NewS3Store(client, "my-bucket")
	if err != nil {
		log.Fatal(err)
	}
	f, err := objectfence.New(store, "tables/orders/manifest", l.Name())
	if err != nil {
		log.Fatal(err)
	}
	base, err := f.Claim(ctx, l.Token()) // from now on no earlier holder commits
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("resuming after %q", base.Payload)
	key, err := f.DataKey(l.Token(), "batch-0001.parquet")
	if err != nil {
		log.Fatal(err)
	}
	// ... upload the batch to key with client.PutObject ...
	next, err := f.Commit(ctx, base, []byte(key)) // next is the base of the next commit
	switch {
	case err == nil:
		log.Printf("committed %q", next.Payload)
	case errors.Is(err, fence.ErrStale):
		log.Print("a newer holder owns the table; stop")
	default:
		// The commit may have landed (fence.ErrOutcomeUnknown), or another
		// commit of this holding came first (objectfence.ErrNotClaimed):
		// claiming again with the same token shows the manifest as it is.
		if now, err := f.Claim(ctx, l.Token()); err == nil {
			log.Printf("the manifest points at %q", now.Payload)
		}
	}
}
