package queuekey

import (
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Which keys under "jobs/" are places in its queue, and which of them keep
// a writer or a reader from the name.
func TestBlocks(t *testing.T) {
	kv := func(key string, lease int64, value string) *mvccpb.KeyValue {
		return &mvccpb.KeyValue{Key: []byte(key), Lease: lease, Value: []byte(value)}
	}
	for _, tc := range []struct {
		name           string
		kv             *mvccpb.KeyValue
		queue          bool
		writer, reader bool // blocks a writer, a reader
	}{
		{"writer's key", kv("jobs/1a", 0x1a, ""), true, true, true},
		{"leader's key", kv("jobs/1a", 0x1a, "node-3"), true, true, true},
		{"reader's key", kv("jobs/1a", 0x1a, ReaderValue), true, true, false},
		{"no lease", kv("jobs/1a", 0, ""), false, false, false},
		{"another lease", kv("jobs/1a", 0x1b, ""), false, false, false},
		{"upper-case hex", kv("jobs/1A", 0x1a, ""), false, false, false},
		{"leading zero", kv("jobs/01a", 0x1a, ""), false, false, false},
		{"nested lock", kv("jobs/x/1a", 0x1a, ""), false, false, false},
		{"data key", kv("jobs/checkpoint", 0x1a, ""), false, false, false},
		{"other name", kv("jobsx/1a", 0x1a, ""), false, false, false},
		{"the prefix itself", kv("jobs/", 0x1a, ""), false, false, false},
	} {
		if got := IsQueueKey("jobs/", tc.kv); got != tc.queue {
			t.Errorf("%s: IsQueueKey = %v", tc.name, got)
		}
		if got := Blocks("jobs/", false, tc.kv); got != tc.writer {
			t.Errorf("%s: blocks a writer = %v", tc.name, got)
		}
		if got := Blocks("jobs/", true, tc.kv); got != tc.reader {
			t.Errorf("%s: blocks a reader = %v", tc.name, got)
		}
	}
}
