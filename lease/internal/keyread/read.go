package keyread

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ReadAtLeast runs the ops serializably (the client's member answers, with
// no quorum round), and linearizably if that member had not applied
// minRev: either way the answer is one revision's state, at least minRev.
func ReadAtLeast(ctx context.Context, cli *clientv3.Client, minRev int64, ops func(...clientv3.OpOption) []clientv3.Op) (*clientv3.TxnResponse, error) {
	resp, err := cli.Txn(ctx).Then(ops(clientv3.WithSerializable())...).Commit()
	if err != nil || resp.Header.Revision >= minRev {
		return resp, err
	}
	return cli.Txn(ctx).Then(ops()...).Commit()
}
