package main

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
)

// change is one key's change in etcd's history.
type change struct {
	rev    int64 // the revision that made it
	key    string
	value  []byte
	create int64 // the key's creation revision; 0 for a delete
	lease  int64
	del    bool
}

// readHistory returns every change under the run's prefix from revision
// rev on, in commit order. It writes a marker and reads up to it, so that
// it has every change made before it was called.
func readHistory(ctx context.Context, cli *clientv3.Client, keys layout, rev int64) ([]change, error) {
	marker, err := cli.Put(ctx, keys.done(), "")
	if err != nil {
		return nil, fmt.Errorf("history marker: %w", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var out []change
	for wr := range cli.Watch(wctx, string(keys)+"/", clientv3.WithPrefix(), clientv3.WithRev(rev)) {
		if err := wr.Err(); err != nil {
			return nil, fmt.Errorf("history: %w", err)
		}
		for _, ev := range wr.Events {
			if string(ev.Kv.Key) == keys.done() {
				if ev.Kv.ModRevision == marker.Header.Revision {
					return out, nil
				}
				continue // an earlier call's marker
			}
			out = append(out, change{rev: ev.Kv.ModRevision, key: string(ev.Kv.Key), value: ev.Kv.Value,
				create: ev.Kv.CreateRevision, lease: ev.Kv.Lease, del: ev.Type == clientv3.EventTypeDelete})
		}
	}
	return nil, fmt.Errorf("history: watch ended: %w", ctx.Err())
}

// audit is what the check of a history found.
type audit struct {
	writes   int // data writes
	handoffs int // times a shard's writes went on under a newer token
	late     int // writes that landed after their holder's lock key was gone
	problems []error
}

// shardLog is what the audit knows of one shard at a point of the
// history.
type shardLog struct {
	record  int64            // the fence record's token
	token   int64            // of the last data write
	count   int64            // of the last data write
	holders map[int64]int64  // lock key's creation revision (a token) → its lease
	gone    map[int64]bool   // tokens whose lock key was deleted
	keys    map[string]int64 // lock key → its creation revision, to place its delete
}

// auditor checks a history change by change.
type auditor struct {
	keys    layout
	shards  []shardLog
	workers map[int64]string // a lease → the worker whose member key it carried
	audit
}

// check audits a run's history, shard by shard:
//   - a fence record never goes down;
//   - every data write carries the token the record holds at the write's
//     revision: it went through the fence, with the token of the newest
//     holding that had claimed the shard;
//   - that token is the creation revision of one of the shard's lock
//     keys, on the lease of the worker the write names;
//   - the counts go 1, 2, 3... with no gap and no repeat: no write was
//     lost, and none was made on a stale read.
func check(keys layout, shards int, h []change) audit {
	a := &auditor{keys: keys, shards: make([]shardLog, shards), workers: map[int64]string{}}
	for s := range a.shards {
		a.shards[s] = shardLog{holders: map[int64]int64{}, gone: map[int64]bool{}, keys: map[string]int64{}}
	}
	// The changes of one revision are one transaction: its record comes
	// before its data, whatever the order of its operations.
	for i := 0; i < len(h); {
		j := i
		for j < len(h) && h[j].rev == h[i].rev {
			j++
		}
		for _, c := range h[i:j] {
			a.state(c)
		}
		for _, c := range h[i:j] {
			if s, _, ok := shardUnder(keys.datas(), c.key); ok && s < shards && !c.del {
				a.data(s, c)
			}
		}
		i = j
	}
	return a.audit
}

func (a *auditor) problem(format string, args ...any) {
	if len(a.problems) < 10 {
		a.problems = append(a.problems, fmt.Errorf(format, args...))
	}
}

// state applies a change of a member key, a lock key or a fence record.
func (a *auditor) state(c change) {
	k := a.keys
	if k.isMember(c.key) && !c.del {
		a.workers[c.lease] = k.memberID(c.key)
		return
	}
	if s, rest, ok := shardUnder(k.locks(), c.key); ok && rest != "" && s < len(a.shards) {
		a.lockKey(&a.shards[s], c)
		return
	}
	if s, _, ok := shardUnder(k.fences(), c.key); ok && s < len(a.shards) && !c.del {
		tok, err := fence.DecodeToken(string(c.value))
		sh := &a.shards[s]
		switch {
		case err != nil:
			a.problem("shard %d: fence record at revision %d: %v", s, c.rev, err)
		case tok < sh.record:
			a.problem("shard %d: fence record went down from %d to %d at revision %d", s, sh.record, tok, c.rev)
		default:
			sh.record = tok
		}
	}
}

// lockKey notes a lock key's creation (a holding and its token) or its
// delete.
func (a *auditor) lockKey(sh *shardLog, c change) {
	if c.del {
		sh.gone[sh.keys[c.key]] = true
		return
	}
	if c.create == c.rev {
		sh.holders[c.create] = c.lease
		sh.keys[c.key] = c.create
	}
}

// data checks one write of shard s against what the shard's record, lock
// keys and last write say.
func (a *auditor) data(s int, c change) {
	sh := &a.shards[s]
	a.writes++
	d, err := parseDatum(c.value)
	if err != nil {
		a.problem("shard %d: revision %d: %v", s, c.rev, err)
		return
	}
	if d.token != sh.record {
		a.problem("shard %d: %s wrote with token %d at revision %d, but the fence record held %d", s, d.writer, d.token, c.rev, sh.record)
	}
	if d.token < sh.token {
		a.problem("shard %d: token went down from %d to %d at revision %d", s, sh.token, d.token, c.rev)
	}
	lease, ok := sh.holders[d.token]
	switch {
	case !ok:
		a.problem("shard %d: token %d of the write at revision %d is no lock key of the shard", s, d.token, c.rev)
	case a.workers[lease] != d.writer:
		a.problem("shard %d: the write at revision %d names %s, token %d is %s's", s, c.rev, d.writer, d.token, a.workers[lease])
	}
	if d.count != sh.count+1 {
		a.problem("shard %d: count went from %d to %d at revision %d", s, sh.count, d.count, c.rev)
	}
	if sh.gone[d.token] {
		a.late++
	}
	if sh.token != 0 && d.token != sh.token {
		a.handoffs++
	}
	sh.token, sh.count = d.token, d.count
}

// err is the audit's verdict: nil if it found no problem.
func (a audit) err() error { return errors.Join(a.problems...) }
