package main

import (
	"slices"
	"testing"
)

func TestFairShareCoversEveryShard(t *testing.T) {
	for _, shards := range []int{1, 7, 256, 1024} {
		for live := 1; live <= 9; live++ {
			share := fairShare(shards, live)
			if share*live < shards || (share-1)*live >= shards {
				t.Errorf("fairShare(%d, %d) = %d: not the least share that covers every shard", shards, live, share)
			}
		}
	}
	if fairShare(10, 0) != 10 {
		t.Error("no live worker counted: the worker itself should take all")
	}
}

func TestPreferenceIsAPermutationPerWorker(t *testing.T) {
	a, b := preference("w1", 64), preference("w2", 64)
	if !slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(preference("w3", 64)))) {
		t.Fatal("not a permutation")
	}
	seen := map[int]bool{}
	for _, s := range a {
		if s < 0 || s >= 64 || seen[s] {
			t.Fatalf("shard %d out of range or twice: %v", s, a)
		}
		seen[s] = true
	}
	if !slices.Equal(a, preference("w1", 64)) {
		t.Error("a worker's order changed between calls")
	}
	if slices.Equal(a[:8], b[:8]) {
		t.Error("two workers prefer the same shards")
	}
}

// set makes a held set.
func set(shards ...int) map[int]bool {
	m := map[int]bool{}
	for _, s := range shards {
		m[s] = true
	}
	return m
}

// lockedAll marks the given shards locked, of n.
func lockedAll(n int, held map[int]bool, others ...int) []bool {
	l := make([]bool, n)
	for s := range held {
		l[s] = true
	}
	for _, s := range others {
		l[s] = true
	}
	return l
}

func TestDecideTakesFreeShardsUpToTheShare(t *testing.T) {
	pref := []int{5, 3, 7, 0, 1, 2, 4, 6}
	held := set(5)
	// Two live workers, 8 shards: a share of 4. Shard 3 is another's.
	p := decide(view{live: 2, locked: lockedAll(8, held, 3)}, held, pref)
	if p.share != 4 || p.want != 3 || len(p.release) != 0 {
		t.Fatalf("plan %+v: want a share of 4 and 3 more", p)
	}
	if !slices.Equal(p.take, []int{7, 0, 1, 2, 4, 6}) {
		t.Errorf("candidates %v: want the free shards in preference order", p.take)
	}
	// At its share, it takes nothing and releases nothing.
	full := set(5, 7, 0, 1)
	if p := decide(view{live: 2, locked: lockedAll(8, full)}, full, pref); p.want != 0 || len(p.take) != 0 || len(p.release) != 0 {
		t.Errorf("at the share: plan %+v", p)
	}
}

func TestDecideReleasesTheWorstSurplusOnAJoin(t *testing.T) {
	pref := []int{5, 3, 7, 0, 1, 2, 4, 6}
	held := set(5, 3, 7, 0, 1, 2, 4, 6)
	// A second worker joined: a share of 4, so 4 to let go, worst first.
	p := decide(view{live: 2, locked: lockedAll(8, held)}, held, pref)
	if !slices.Equal(p.release, []int{6, 4, 2, 1}) || p.want != 0 || len(p.take) != 0 {
		t.Errorf("plan %+v: want the four worst released", p)
	}
}

// Three workers with their own preferences, taking in turn from what is
// free, end up owning every shard, none over its share; and when one
// leaves, the other two take its shards.
func TestDecideConvergesAmongWorkers(t *testing.T) {
	const n = 100
	ids := []string{"w1", "w2", "w3"}
	owner := make([]string, n)
	held := map[string]map[int]bool{}
	for _, id := range ids {
		held[id] = map[int]bool{}
	}
	passes := func(live []string) {
		for range 3 {
			for _, id := range live {
				locked := make([]bool, n)
				for s, o := range owner {
					locked[s] = o != ""
				}
				p := decide(view{live: len(live), locked: locked}, held[id], preference(id, n))
				for _, s := range p.release {
					delete(held[id], s)
					owner[s] = ""
				}
				for _, s := range p.take[:min(p.want, len(p.take))] {
					held[id][s] = true
					owner[s] = id
				}
			}
		}
	}
	passes(ids)
	for s, o := range owner {
		if o == "" {
			t.Fatalf("shard %d unowned", s)
		}
	}
	for _, id := range ids {
		if len(held[id]) > fairShare(n, 3) {
			t.Errorf("%s holds %d, share %d", id, len(held[id]), fairShare(n, 3))
		}
	}
	// w3 is lost: its locks go with its lease.
	for s := range held["w3"] {
		owner[s] = ""
	}
	passes(ids[:2])
	for s, o := range owner {
		if o == "" || o == "w3" {
			t.Fatalf("shard %d owned by %q after w3 left", s, o)
		}
	}
}
