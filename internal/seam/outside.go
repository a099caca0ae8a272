package seam

import (
	"context"
	"database/sql"
	"strconv"
	"strings"

	"github.com/leasefence/leasefence/internal/etcdcompat"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// KV returns kv, or under NoFenceCompare a KV whose transactions have the
// fence's comparisons decided in the writer's favour: the checks are still
// built and sent, but a lock key always counts as held (a creation
// revision comparison holds) and a record never counts as above the token
// (a value comparison with ">" fails, any other holds: "at most" and
// "equal to" the token), so every guarded write lands. The suite's writes
// have no comparisons of their own, which this would also rewrite.
func KV(ctx context.Context, kv clientv3.KV) clientv3.KV {
	if From(ctx).On() != NoFenceCompare {
		return kv
	}
	return unfencedKV{kv}
}

type unfencedKV struct{ clientv3.KV }

func (k unfencedKV) Txn(ctx context.Context) clientv3.Txn { return &unfencedTxn{inner: k.KV.Txn(ctx)} }

type unfencedTxn struct {
	inner clientv3.Txn
	cmps  []clientv3.Cmp
	then  []clientv3.Op
	els   []clientv3.Op
}

func (t *unfencedTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.cmps = append(t.cmps, cs...); return t }
func (t *unfencedTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.then = append(t.then, ops...)
	return t
}
func (t *unfencedTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.els = append(t.els, ops...)
	return t
}

func (t *unfencedTxn) Commit() (*clientv3.TxnResponse, error) {
	return t.inner.If(writerWins(t.cmps)...).Then(unfenced(t.then)...).Else(unfenced(t.els)...).Commit()
}

// writerWins replaces each comparison by one on the same key whose result
// is fixed whatever the key's state (a creation revision is never
// negative): false for a record checked as above the token, true for
// every other check.
func writerWins(cmps []clientv3.Cmp) []clientv3.Cmp {
	out := make([]clientv3.Cmp, len(cmps))
	for i, c := range cmps {
		op := ">" // always true
		if pc := etcdcompat.Compare(c); pc.GetTarget() == pb.Compare_VALUE && pc.GetResult() == pb.Compare_GREATER {
			op = "<" // always false
		}
		out[i] = clientv3.Compare(clientv3.CreateRevision(string(c.KeyBytes())), op, -1)
	}
	return out
}

func unfenced(ops []clientv3.Op) []clientv3.Op {
	out := make([]clientv3.Op, len(ops))
	for i, op := range ops {
		if op.IsTxn() {
			cmps, then, els := op.Txn()
			op = clientv3.OpTxn(writerWins(cmps), unfenced(then), unfenced(els))
		}
		out[i] = op
	}
	return out
}

// Execer is what package sqlfence runs its statements on.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// SQL returns db, or under NoFenceCompare an Execer that strips the token
// comparison from sqlfence's statements: the UPDATE's "AND token <= ?" and
// the upsert's "DO UPDATE ... WHERE" condition.
func SQL(ctx context.Context, db Execer) Execer {
	if From(ctx).On() != NoFenceCompare {
		return db
	}
	return unfencedSQL{db}
}

type unfencedSQL struct{ Execer }

func (u unfencedSQL) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	switch {
	case strings.HasPrefix(q, "INSERT "):
		if i := strings.LastIndex(q, " WHERE "); i >= 0 {
			q = q[:i] + " WHERE 1 = 1"
		}
	case strings.HasPrefix(q, "UPDATE "):
		if i := strings.LastIndex(q, " AND "); i >= 0 {
			q, args = q[:i], args[:len(args)-1]
		}
	}
	return u.Execer.ExecContext(ctx, q, args...)
}

// ReportedToken is the token the suite reads off a holder: its real token,
// or under LeaseIDToken the lease ID from its key, or under
// HeaderRevisionToken the revision of a read made after the grant.
func ReportedToken(ctx context.Context, kv clientv3.KV, key string, token int64) (int64, error) {
	switch From(ctx).On() {
	case LeaseIDToken:
		return strconv.ParseInt(key[strings.LastIndex(key, "/")+1:], 16, 64)
	case HeaderRevisionToken:
		resp, err := kv.Get(ctx, key, clientv3.WithKeysOnly())
		if err != nil {
			return 0, err
		}
		return resp.Header.Revision, nil
	}
	return token, nil
}

// Unlocker is a lock holding that can be released.
type Unlocker interface {
	Key() string
	Unlock(ctx context.Context) error
}

// Unlock releases l, or under UnguardedUnlock deletes its key by name, as
// concurrency.Mutex does, whoever holds that key now.
func Unlock(ctx context.Context, kv clientv3.KV, l Unlocker) error {
	if From(ctx).On() == UnguardedUnlock {
		_, err := kv.Delete(ctx, l.Key())
		return err
	}
	return l.Unlock(ctx)
}
