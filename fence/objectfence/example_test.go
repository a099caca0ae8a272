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
// a key of its own token, and commits a pointer to it.
func Example() {
	ctx := context.Background()
	var l *lease.Lock     // held: session.Lock(ctx, "tables/orders")
	var client *s3.Client // s3.NewFromConfig(cfg), cfg from config.LoadDefaultConfig
	store, err := objectfence.NewS3Store(client, "my-bucket")
	if err != nil {
		log.Fatal(err)
	}
	f, err := objectfence.New(store, "tables/orders/manifest")
	if err != nil {
		log.Fatal(err)
	}
	m, err := f.Claim(ctx, l.Token()) // from now on no earlier holder commits
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("resuming after %q", m.Payload)
	key, err := f.DataKey(l.Token(), "batch-0001.parquet")
	if err != nil {
		log.Fatal(err)
	}
	// ... upload the batch to key with client.PutObject ...
	if _, err := f.Commit(ctx, l.Token(), []byte(key)); errors.Is(err, fence.ErrStale) {
		log.Print("a newer holder owns the table; stop")
	}
}
