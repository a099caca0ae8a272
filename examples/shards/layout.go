package main

import (
	"fmt"
	"strconv"
	"strings"
)

// layout is where a run's keys live, all under one prefix:
//
//	PREFIX/members/ID    a live worker, on its session's lease
//	PREFIX/lock/SHARD    the shard's lock name (lock keys are one level under it)
//	PREFIX/fence/SHARD   the shard's fence record: the highest token accepted
//	PREFIX/data/SHARD    the shard's data: "writer=ID token=T count=N"
//
// Data and records live beside the lock names, not under them, so that a
// listing of PREFIX/lock/ holds lock keys alone.
type layout string

func (p layout) members() string            { return string(p) + "/members/" }
func (p layout) member(id string) string    { return p.members() + id }
func (p layout) locks() string              { return string(p) + "/lock/" }
func (p layout) lockName(shard int) string  { return p.locks() + shardName(shard) }
func (p layout) fences() string             { return string(p) + "/fence/" }
func (p layout) fenceKey(shard int) string  { return p.fences() + shardName(shard) }
func (p layout) datas() string              { return string(p) + "/data/" }
func (p layout) dataKey(shard int) string   { return p.datas() + shardName(shard) }
func (p layout) done() string               { return string(p) + "/done" }
func (p layout) isMember(key string) bool   { return strings.HasPrefix(key, p.members()) }
func (p layout) memberID(key string) string { return strings.TrimPrefix(key, p.members()) }

// shardName pads the number so that etcd lists shards in order.
func shardName(shard int) string { return fmt.Sprintf("%04d", shard) }

// shardUnder reads the shard number from a key under dir: dir + SHARD, or
// dir + SHARD + "/" + anything (a lock key). ok is false for other keys.
func shardUnder(dir, key string) (shard int, rest string, ok bool) {
	name, found := strings.CutPrefix(key, dir)
	if !found {
		return 0, "", false
	}
	name, rest, _ = strings.Cut(name, "/")
	n, err := strconv.Atoi(name)
	if err != nil || n < 0 {
		return 0, "", false
	}
	return n, rest, true
}

// datum is one value of a shard's data key.
type datum struct {
	writer string
	token  int64
	count  int64 // the number of writes the shard has taken, this one included
}

func (d datum) String() string {
	return fmt.Sprintf("writer=%s token=%d count=%d", d.writer, d.token, d.count)
}

// parseDatum reads a data value written by datum.String.
func parseDatum(v []byte) (datum, error) {
	var d datum
	if _, err := fmt.Sscanf(string(v), "writer=%s token=%d count=%d", &d.writer, &d.token, &d.count); err != nil {
		return datum{}, fmt.Errorf("data value %q: %w", v, err)
	}
	return d, nil
}
