package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/leasefence/leasefence/fence"
)

// hist builds a history by hand, one revision per call.
type hist struct {
	keys    layout
	rev     int64
	changes []change
}

func (h *hist) next() int64 { h.rev++; return h.rev }

func (h *hist) member(id string, lease int64) {
	rev := h.next()
	h.changes = append(h.changes, change{rev: rev, key: h.keys.member(id), value: []byte(id), create: rev, lease: lease})
}

func (h *hist) lockKey(shard int, lease int64) string {
	return fmt.Sprintf("%s/%x", h.keys.lockName(shard), lease)
}

// lock creates a lock key for shard on lease and returns its token.
func (h *hist) lock(shard int, lease int64) int64 {
	rev := h.next()
	h.changes = append(h.changes, change{rev: rev, key: h.lockKey(shard, lease), create: rev, lease: lease})
	return rev
}

// expire deletes the lock key, as a lease's expiry does.
func (h *hist) expire(shard int, lease int64) {
	h.changes = append(h.changes, change{rev: h.next(), key: h.lockKey(shard, lease), del: true})
}

// record sets the fence record, as a claim does.
func (h *hist) record(shard int, token int64) {
	h.changes = append(h.changes, change{rev: h.next(), key: h.keys.fenceKey(shard), value: []byte(fence.EncodeToken(token)), create: 1})
}

// write is a data write; fenced puts the record in the same revision, as
// a Resource guard's first write does.
func (h *hist) write(shard int, d datum, fenced bool) {
	rev := h.next()
	if fenced {
		h.changes = append(h.changes, change{rev: rev, key: h.keys.fenceKey(shard), value: []byte(fence.EncodeToken(d.token)), create: 1})
	}
	h.changes = append(h.changes, change{rev: rev, key: h.keys.dataKey(shard), value: []byte(d.String()), create: 1})
}

// handoff is a correct history of shard 0: w1 writes twice, its lease
// expires, w2 takes the shard, claims it, and writes once. It returns the
// two tokens.
func handoff(h *hist) (t1, t2 int64) {
	h.member("w1", 0x10)
	h.member("w2", 0x20)
	t1 = h.lock(0, 0x10)
	h.record(0, t1)
	h.write(0, datum{"w1", t1, 1}, true)
	h.write(0, datum{"w1", t1, 2}, false)
	h.expire(0, 0x10)
	t2 = h.lock(0, 0x20)
	h.record(0, t2)
	h.write(0, datum{"w2", t2, 3}, true)
	return t1, t2
}

func TestCheckPassesAHandoff(t *testing.T) {
	h := &hist{keys: "p"}
	handoff(h)
	a := check(h.keys, 2, h.changes)
	if err := a.err(); err != nil {
		t.Fatal(err)
	}
	if a.writes != 3 || a.handoffs != 1 || a.late != 0 {
		t.Errorf("audit %+v: want 3 writes, 1 handoff, none late", a)
	}
}

// Each forged history breaks one rule, and the check must say which.
func TestCheckCatchesOldOwners(t *testing.T) {
	for _, c := range []struct {
		name  string
		forge func(h *hist, t1, t2 int64)
		want  string
	}{
		{"a late write without the fence", func(h *hist, t1, _ int64) {
			h.write(0, datum{"w1", t1, 4}, false)
		}, "but the fence record held"},
		{"a fence record lowered", func(h *hist, t1, _ int64) {
			h.record(0, t1)
		}, "fence record went down"},
		{"a new owner that did not read", func(h *hist, _, t2 int64) {
			h.write(0, datum{"w2", t2, 1}, false)
		}, "count went from 3 to 1"},
		{"a token that is no holding", func(h *hist, _, _ int64) {
			h.write(0, datum{"w2", 999, 4}, true)
		}, "is no lock key"},
		{"a write under another worker's token", func(h *hist, _, t2 int64) {
			h.write(0, datum{"w1", t2, 4}, false)
		}, "names w1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := &hist{keys: "p"}
			t1, t2 := handoff(h)
			c.forge(h, t1, t2)
			err := check(h.keys, 2, h.changes).err()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("check: %v, want %q", err, c.want)
			}
		})
	}
}

// A write by a holding whose lock key is gone, with no later claim, is
// let through by the fence; the check counts it, and finds nothing wrong.
func TestCheckCountsLateWrites(t *testing.T) {
	h := &hist{keys: "p"}
	h.member("w1", 0x10)
	t1 := h.lock(0, 0x10)
	h.record(0, t1)
	h.write(0, datum{"w1", t1, 1}, true)
	h.expire(0, 0x10)
	h.write(0, datum{"w1", t1, 2}, false)
	a := check(h.keys, 1, h.changes)
	if err := a.err(); err != nil || a.late != 1 {
		t.Fatalf("audit %+v (%v): want one late write and no problem", a, err)
	}
}

func TestDatumRoundTrip(t *testing.T) {
	d := datum{writer: "w3", token: 12345, count: 7}
	got, err := parseDatum([]byte(d.String()))
	if err != nil || got != d {
		t.Fatalf("parseDatum(%q) = %+v, %v", d.String(), got, err)
	}
	if _, err := parseDatum([]byte("offset 42")); err == nil {
		t.Fatal("a foreign value was parsed")
	}
}

func TestShardUnder(t *testing.T) {
	k := layout("p")
	for _, c := range []struct {
		key   string
		shard int
		rest  string
		ok    bool
	}{
		{k.lockName(12) + "/694d", 12, "694d", true},
		{k.fenceKey(3), 3, "", true},
		{k.locks() + "x/694d", 0, "", false},
		{k.member("w1"), 0, "", false},
	} {
		s, rest, ok := shardUnder(k.locks(), c.key)
		if c.key == k.fenceKey(3) {
			s, rest, ok = shardUnder(k.fences(), c.key)
		}
		if s != c.shard || rest != c.rest || ok != c.ok {
			t.Errorf("shardUnder(%q) = %d %q %v", c.key, s, rest, ok)
		}
	}
}
