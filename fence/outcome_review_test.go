package fence_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// A claim whose reads are too large for the client's receive limit: etcd
// applied it (the record is raised), but the answer never arrived. That
// outcome is unknown, and must not be reported as a definite failure.
func TestReviewClaimAnswerTooLarge(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	small, err := clientv3.New(clientv3.Config{
		Endpoints:          etcd.Endpoints(),
		Logger:             zap.NewNop(),
		MaxCallRecvMsgSize: 64 << 10,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	base := etcdproc.Name(t, "review-big")
	rec, data := base+"/fence", base+"/data"
	if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), data, strings.Repeat("x", 200<<10)); err != nil {
		t.Fatal(err)
	}
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, 5)).Commit(); err != nil {
		t.Fatal(err)
	}
	_, err = fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), small, fence.Claim(rec, 10)).Then(clientv3.OpGet(data)).Commit()
	highest, rerr := fence.ReadRecord(etcdproc.Ctx(t, 30*time.Second), cli, rec)
	if rerr != nil {
		t.Fatal(rerr)
	}
	t.Logf("claim: %v; record now %d", err, highest)
	if err == nil {
		t.Fatal("the claim's answer arrived through a 64 KiB receive limit")
	}
	if highest == 10 && !errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("etcd applied the claim (record 10), yet Commit reported a definite failure: %v", err)
	}
}

// The compare-only shapes (a check alone, a Recorder's steady write) on a
// record key attached to a lease. The package doc says such a transaction
// is refused with ErrBadRecord and changes nothing.
func TestReviewLeasedRecordCompareOnly(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	g, err := cli.Grant(etcdproc.Ctx(t, 30*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Revoke(etcdproc.Ctx(t, 30*time.Second), g.ID)
	t.Run("check alone", func(t *testing.T) {
		rec := etcdproc.Name(t, "review-leased") + "/fence"
		if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), rec, fence.EncodeToken(7), clientv3.WithLease(g.ID)); err != nil {
			t.Fatal(err)
		}
		_, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, 7)).Commit()
		if !errors.Is(err, fence.ErrBadRecord) {
			t.Fatalf("check alone on a leased record: %v, want ErrBadRecord", err)
		}
	})
	t.Run("recorder steady", func(t *testing.T) {
		base := etcdproc.Name(t, "review-leased")
		rec, data := base+"/fence", base+"/data"
		r := fence.NewRecorder(rec)
		if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, r.Guard(7)).Then(clientv3.OpPut(data, "1")).Commit(); err != nil {
			t.Fatal(err)
		}
		// Someone else's put attaches the record to a lease, same value.
		if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), rec, fence.EncodeToken(7), clientv3.WithLease(g.ID)); err != nil {
			t.Fatal(err)
		}
		_, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, r.Guard(7)).Then(clientv3.OpPut(data, "2")).Commit()
		if v, _ := get(t, cli, data); !errors.Is(err, fence.ErrBadRecord) || v != "1" {
			t.Fatalf("steady write through a leased record: %v, data %q; want ErrBadRecord and data unchanged", err, v)
		}
	})
}
