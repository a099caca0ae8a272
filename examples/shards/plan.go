package main

import (
	"cmp"
	"hash/fnv"
	"slices"
)

// fairShare is the most shards one of live workers holds: ceil(shards /
// live). The shares of the live workers add up to at least shards, so
// every shard can be owned, and no worker holds more than one shard above
// another's count once they agree on live.
func fairShare(shards, live int) int {
	live = max(live, 1)
	return (shards + live - 1) / live
}

// preference orders the shards for worker id by rendezvous hashing: each
// worker ranks every shard by a hash of its own ID and the shard, takes
// free shards best first and lets go of its worst first. Workers so reach
// for different free shards, and few TryLocks collide; and a worker that
// comes back wants much the shards it had.
func preference(id string, shards int) []int {
	score := make([]uint64, shards)
	for s := range score {
		h := fnv.New64a()
		h.Write([]byte(id + "/" + shardName(s)))
		score[s] = h.Sum64()
	}
	pref := make([]int, shards)
	for s := range pref {
		pref[s] = s
	}
	slices.SortFunc(pref, func(a, b int) int {
		return cmp.Or(cmp.Compare(score[a], score[b]), cmp.Compare(a, b))
	})
	return pref
}

// view is what one pass reads from etcd, in one request, so at one
// revision.
type view struct {
	live   int    // workers registered, this one counted even if its key is missing
	locked []bool // per shard: some lock key exists, whoever's (this worker's too)
}

// plan is what one pass does: release some shards, or try to take some.
type plan struct {
	share   int
	release []int // held shards to let go, worst first
	take    []int // free shards to try, best first
	want    int   // how many of take to get
}

// decide is the pass's decision, from what it read, what this worker
// holds, and its preference order. A worker above its share lets go of the
// surplus (a worker joined); one below it tries the free shards, until it
// has its share (a worker left, or this one is new). The free shards are
// only candidates: TryLock decides, and a shard taken by another worker
// since the read is skipped.
func decide(v view, held map[int]bool, pref []int) plan {
	p := plan{share: fairShare(len(v.locked), v.live)}
	if surplus := len(held) - p.share; surplus > 0 {
		for i := len(pref) - 1; i >= 0 && len(p.release) < surplus; i-- {
			if held[pref[i]] {
				p.release = append(p.release, pref[i])
			}
		}
		return p
	}
	if p.want = p.share - len(held); p.want == 0 {
		return p
	}
	for _, s := range pref {
		if !v.locked[s] && !held[s] {
			p.take = append(p.take, s)
		}
	}
	return p
}
