package fence_test

import (
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

func TestReadRecords(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	pfx := etcdproc.Name(t, "records") + "/"
	if h, err := fence.ReadRecord(etcdproc.Ctx(t, 30*time.Second), cli, pfx+"a"); err != nil || h != 0 {
		t.Fatalf("missing record: %d, %v; want 0, nil", h, err)
	}
	for _, w := range []struct {
		rec   string
		token int64
	}{{"a", 7}, {"b", 12}, {"a", 9}} {
		if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(pfx+w.rec, w.token)).Then(clientv3.OpPut(pfx+"data-"+w.rec, "v")).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), pfx+"c", "not a token"); err != nil {
		t.Fatal(err)
	}
	if h, err := fence.ReadRecord(etcdproc.Ctx(t, 30*time.Second), cli, pfx+"a"); err != nil || h != 9 {
		t.Fatalf("record a: %d, %v; want 9", h, err)
	}
	if _, err := fence.ReadRecord(etcdproc.Ctx(t, 30*time.Second), cli, pfx+"c"); !errors.Is(err, fence.ErrBadRecord) {
		t.Fatalf("record c: %v, want ErrBadRecord", err)
	}
	recs, err := fence.ReadRecords(etcdproc.Ctx(t, 30*time.Second), cli, pfx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, r := range recs {
		if r.Err != nil {
			got[r.Key] = -1
			continue
		}
		got[r.Key] = r.Highest
	}
	if got[pfx+"a"] != 9 || got[pfx+"b"] != 12 || got[pfx+"c"] != -1 {
		t.Fatalf("records %+v", recs)
	}
	if _, err := fence.ReadRecords(etcdproc.Ctx(t, 30*time.Second), cli, ""); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("empty prefix: %v", err)
	}
}
