package bench

import (
	"context"
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/leasefence/leasefence/lease"
)

type ourCandidate struct {
	s    *lease.Session
	name string
}

func (o ourCandidate) lock(ctx context.Context) (string, int64, func(context.Context) error, error) {
	e, err := o.s.Campaign(ctx, o.name, "candidate")
	if err != nil {
		return "", 0, nil, err
	}
	return e.Key(), e.Token(), e.Resign, nil
}

type etcdCandidate struct{ e *concurrency.Election }

func (c etcdCandidate) lock(ctx context.Context) (string, int64, func(context.Context) error, error) {
	if err := c.e.Campaign(ctx, "candidate"); err != nil {
		return "", 0, nil, err
	}
	return c.e.Key(), c.e.Rev(), c.e.Resign, nil
}

var candidates = []impl{
	{"leasefence", func(b *testing.B, cli *clientv3.Client, name string, opts ...lease.Option) locker {
		s, err := lease.NewSession(context.Background(), cli, opts...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return ourCandidate{s, name}
	}},
	{"concurrency.Election", func(b *testing.B, cli *clientv3.Client, name string, _ ...lease.Option) locker {
		s, err := concurrency.NewSession(cli)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return etcdCandidate{concurrency.NewElection(s, name)}
	}},
}

// BenchmarkElectionHandoff is BenchmarkHandoff for leadership: Campaign,
// then Resign, by 1 and 4 candidates on one shared client (fsync off),
// against concurrency.Election in the same run.
func BenchmarkElectionHandoff(b *testing.B) {
	for _, n := range []int{1, 4} {
		for _, im := range candidates {
			b.Run(fmt.Sprintf("candidates=%d/impl=%s", n, im.name), func(b *testing.B) {
				handoffBench(b, im, "shared", n, cluster(b, 1, true).Endpoints()[0])
			})
		}
	}
}
