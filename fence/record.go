package fence

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Record is a fence record as etcd has it.
type Record struct {
	Key     string
	Highest int64 // the highest token the record has accepted
	// Err is set, and Highest is 0, if the value is not a token this
	// package wrote (it wraps ErrBadRecord).
	Err error
}

// ReadRecord reads the highest token recorded at key by Resource guards.
// A missing record gives 0 and no error: any token passes it. A value
// this package did not write gives an error wrapping ErrBadRecord. It
// writes nothing.
func ReadRecord(ctx context.Context, kv clientv3.KV, key string) (int64, error) {
	if kv == nil || key == "" {
		return 0, fmt.Errorf("%w: nil KV or empty key", ErrInvalidArgument)
	}
	resp, err := kv.Get(ctx, key)
	if err != nil {
		return 0, fmt.Errorf("fence: read record %q: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	return DecodeToken(string(resp.Kvs[0].Value))
}

// ReadRecords reads every key under prefix as a fence record, in key
// order, in one request. Keys whose values are not tokens come back with
// Err set, so that a prefix shared with other data can still be listed.
func ReadRecords(ctx context.Context, kv clientv3.KV, prefix string) ([]Record, error) {
	if kv == nil || prefix == "" {
		return nil, fmt.Errorf("%w: nil KV or empty prefix", ErrInvalidArgument)
	}
	resp, err := kv.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("fence: read records %q: %w", prefix, err)
	}
	recs := make([]Record, len(resp.Kvs))
	for i, r := range resp.Kvs {
		recs[i].Key = string(r.Key)
		recs[i].Highest, recs[i].Err = DecodeToken(string(r.Value))
	}
	return recs, nil
}
