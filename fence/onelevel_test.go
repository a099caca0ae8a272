package fence_test

import (
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// A Resource guard's write is one transaction without nesting whenever
// the record exists and holds a token (at, below or above the writer's),
// and a Held guard that fails is told apart in that one round trip too;
// only a record that is missing, or holds what this package did not
// write, takes the full, nested shape as a second round trip. Every case
// leaves the record and the data as the guard promises.
func TestResourceOneLevel(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	const writer = 10
	cases := []struct {
		name       string
		record     string // the record's value before the write; "" for none
		lockGone   bool   // the Held guard's lock key deleted before the write
		wantTrips  int
		wantNested int
		wantErr    error // nil: the write applies
		wantRecord string
	}{
		{"steady: the record at the token", fence.EncodeToken(writer), false, 1, 0, nil, fence.EncodeToken(writer)},
		{"a new holder: the record below", fence.EncodeToken(writer - 3), false, 1, 0, nil, fence.EncodeToken(writer)},
		{"a late holder: the record above", fence.EncodeToken(writer + 1), false, 1, 0, fence.ErrStale, fence.EncodeToken(writer + 1)},
		{"the lock gone", fence.EncodeToken(writer), true, 1, 0, fence.ErrNotHeld, fence.EncodeToken(writer)},
		{"the record's first write", "", false, 2, 1, nil, fence.EncodeToken(writer)},
		// Sorts between the token and the next: not a token, refused by
		// the full shape.
		{"a value this package did not write", fence.EncodeToken(writer) + "x", false, 2, 1, fence.ErrBadRecord, fence.EncodeToken(writer) + "x"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base := etcdproc.Name(t, "onelevel")
			rec, data := base+"/fence", base+"/data"
			h, _ := lockPut(t, cli, base+"/lock")
			lock := h.key
			if tc.record != "" {
				if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), rec, tc.record); err != nil {
					t.Fatal(err)
				}
			}
			if tc.lockGone {
				if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), lock); err != nil {
					t.Fatal(err)
				}
			}
			before := revision(t, cli)
			kv := &countingKV{KV: cli}
			resp, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), kv, fence.Held(h), fence.Resource(rec, writer)).
				Then(clientv3.OpPut(data, "v"), clientv3.OpGet(lock)).
				Commit()
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("write: %v, want %v", err, tc.wantErr)
			}
			if kv.sent != tc.wantTrips || kv.nested != tc.wantNested {
				t.Errorf("%d round trips, %d nested; want %d, %d", kv.sent, kv.nested, tc.wantTrips, tc.wantNested)
			}
			if v, _ := get(t, cli, rec); v != tc.wantRecord {
				t.Errorf("record %q, want %q", v, tc.wantRecord)
			}
			v, written := get(t, cli, data)
			if tc.wantErr != nil {
				if written || revision(t, cli) != before {
					t.Fatal("a refused write changed the store")
				}
				return
			}
			if !written || v != "v" {
				t.Fatalf("data %q (written %v) after an accepted write", v, written)
			}
			// The caller's part of the answer, past the record's put.
			if len(resp.Responses) != 2 || len(resp.Responses[1].GetResponseRange().Kvs) != 1 {
				t.Fatalf("caller's responses: %v", resp.Responses)
			}
		})
	}
}

// A transaction whose caller's part writes nothing (a check alone, as
// fencehttp's EtcdStore.Accept sends) is sent as comparisons alone, which
// makes no revision while the record holds the token (etcd serves it as a
// read), and still raises a record below it, through the full shape.
func TestResourceCheckAlone(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	rec := etcdproc.Name(t, "check") + "/fence"
	if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), rec, fence.EncodeToken(5)); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name       string
		token      int64
		then       []clientv3.Op
		wantMoved  bool // the store's revision moves
		wantTrips  int
		wantNested int
		wantWrites int // transactions sent that may write (etcd serves the rest as reads)
		wantErr    error
		wantRecord int64
	}{
		{"raises the record below", 7, nil, true, 2, 1, 1, nil, 7},
		{"steady: a read", 7, nil, false, 1, 0, 0, nil, 7},
		{"steady, with a read of the caller's: a read", 7, []clientv3.Op{clientv3.OpGet(rec)}, false, 1, 0, 0, nil, 7},
		{"refused: the record above", 6, nil, false, 1, 0, 0, fence.ErrStale, 7},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := revision(t, cli)
			kv := &countingKV{KV: cli}
			_, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), kv, fence.Resource(rec, tc.token)).Then(tc.then...).Commit()
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("check: %v, want %v", err, tc.wantErr)
			}
			if moved := revision(t, cli) != before; moved != tc.wantMoved {
				t.Errorf("revision moved: %v, want %v", moved, tc.wantMoved)
			}
			if kv.sent != tc.wantTrips || kv.nested != tc.wantNested || kv.writing != tc.wantWrites {
				t.Errorf("%d round trips, %d nested, %d that may write; want %d, %d, %d",
					kv.sent, kv.nested, kv.writing, tc.wantTrips, tc.wantNested, tc.wantWrites)
			}
			if v, _ := get(t, cli, rec); v != fence.EncodeToken(tc.wantRecord) {
				t.Errorf("record %q, want token %d", v, tc.wantRecord)
			}
		})
	}
}
