package fence_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// A Recorder's writes are one round trip each in every case but one (the
// record found missing or lower than it knew: two), are refused with the
// record's highest token when it is above theirs, and leave the record
// and data as Resource guards would.
func TestRecorder(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	cases := []struct {
		name string
		// before runs after a first write with token 10 through the
		// Recorder; then the Recorder writes with token.
		before    func(t *testing.T, rec string)
		token     int64
		wantTrips int
		wantStale int64 // the highest token a refusal reports; 0: accepted
		wantRec   int64
	}{
		{"steady: same token again", func(*testing.T, string) {}, 10, 1, 0, 10},
		{"a new holder's first write", func(*testing.T, string) {}, 20, 1, 0, 20},
		{"record raised by someone newer", func(t *testing.T, rec string) {
			if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, 30)).Commit(); err != nil {
				t.Fatal(err)
			}
		}, 10, 1, 30, 30},
		{"record deleted behind its back", func(t *testing.T, rec string) {
			if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), rec); err != nil {
				t.Fatal(err)
			}
		}, 10, 2, 0, 10},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base := etcdproc.Name(t, "recorder")
			rec, data := base+"/fence", base+"/data"
			r := fence.NewRecorder(rec)
			if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, r.Guard(10)).Then(clientv3.OpPut(data, "first")).Commit(); err != nil {
				t.Fatal(err)
			}
			tc.before(t, rec)
			kv := &countingKV{KV: cli}
			_, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), kv, r.Guard(tc.token)).Then(clientv3.OpPut(data, "second")).Commit()
			var stale *fence.StaleError
			switch {
			case tc.wantStale == 0 && err != nil:
				t.Fatalf("write: %v", err)
			case tc.wantStale != 0 && (!errors.As(err, &stale) || stale.Highest != tc.wantStale):
				t.Fatalf("write: %v, want a StaleError with highest %d", err, tc.wantStale)
			}
			if kv.sent != tc.wantTrips {
				t.Errorf("%d round trips, want %d", kv.sent, tc.wantTrips)
			}
			if got, err := fence.ReadRecord(etcdproc.Ctx(t, 30*time.Second), cli, rec); err != nil || got != tc.wantRec {
				t.Errorf("record %d (%v), want %d", got, err, tc.wantRec)
			}
			want := "second"
			if tc.wantStale != 0 {
				want = "first"
			}
			if v, _ := get(t, cli, data); v != want {
				t.Errorf("data %q, want %q", v, want)
			}
		})
	}
}

// The steady shape keeps the Held check and the caller's own If/Else.
func TestRecorderSteadyWithHeldAndCallerTxn(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "recorder-held")
	_, l := newLock(t, cli, name)
	r := fence.NewRecorder(name + "-fence")
	data := name + "-data"
	put := func(v string) error {
		_, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(l), r.Guard(l.Token())).Then(clientv3.OpPut(data, v)).Commit()
		return err
	}
	if err := put("1"); err != nil {
		t.Fatal(err)
	}
	if err := put("2"); err != nil { // steady
		t.Fatal(err)
	}
	resp, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, r.Guard(l.Token())).
		If(clientv3.Compare(clientv3.Value(data), "=", "nope")).
		Then(clientv3.OpPut(data, "then")).
		Else(clientv3.OpGet(data)).Commit()
	if err != nil || resp.Succeeded || string(resp.Responses[0].GetResponseRange().Kvs[0].Value) != "2" {
		t.Fatalf("caller's Else through the steady shape: %v %v", resp, err)
	}
	if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := put("3"); !errors.Is(err, fence.ErrNotHeld) {
		t.Fatalf("steady write after Unlock: %v, want ErrNotHeld", err)
	}
	if v, _ := get(t, cli, data); v != "2" {
		t.Errorf("data %q after refused writes, want 2", v)
	}
}

// The steady shape is tried before the full one is built: a write that
// fits only the steady shape goes through in the steady state, and once
// what the Recorder knew is wrong, the full shape is refused as too large
// before it is sent, the failed steady attempt having changed nothing.
func TestRecorderSteadyBeforeFullShape(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	base := etcdproc.Name(t, "recorder-size")
	rec := base + "/fence"
	r := fence.NewRecorder(rec)
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, r.Guard(10)).Then(clientv3.OpPut(base+"/first", "x")).Commit(); err != nil {
		t.Fatal(err)
	}
	// One record's full shape leaves MaxTxnOps - 3 operations to the
	// caller; the steady shape, MaxTxnOps.
	puts := make([]clientv3.Op, fence.MaxTxnOps-1)
	for i := range puts {
		puts[i] = clientv3.OpPut(fmt.Sprintf("%s/data/%03d", base, i), "v")
	}
	kv := &countingKV{KV: cli}
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), kv, r.Guard(10)).Then(puts...).Commit(); err != nil || kv.sent != 1 {
		t.Fatalf("steady write of %d puts: %v, %d round trips; want it applied in 1", len(puts), err, kv.sent)
	}
	if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), rec); err != nil {
		t.Fatal(err)
	}
	before := revision(t, cli)
	kv = &countingKV{KV: cli}
	_, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), kv, r.Guard(10)).Then(puts...).Commit()
	if !errors.Is(err, fence.ErrInvalidArgument) || kv.sent != 1 {
		t.Fatalf("write after the record went: %v, %d round trips; want ErrInvalidArgument after the one steady attempt", err, kv.sent)
	}
	if revision(t, cli) != before {
		t.Error("the refused write changed something")
	}
	if _, ok := get(t, cli, rec); ok {
		t.Error("the refused write recreated the record")
	}
}
