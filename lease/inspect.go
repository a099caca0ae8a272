package lease

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/leasefence/leasefence/lease/internal/delayrec"
	"github.com/leasefence/leasefence/lease/internal/keywrite"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// QueueEntry is one place in a lock's queue, as etcd has it.
type QueueEntry struct {
	Key   string           // the lock key: name + "/" + the lease ID in hex
	Token int64            // its creation revision: the holder's fencing token
	Lease clientv3.LeaseID // the lease it is attached to
	// TTL is the lease's time left, as etcd counts it (whole seconds); 0
	// if the lease was gone by the time it was asked.
	TTL   time.Duration
	Value string // empty for a lock; the candidate's value in an election; ReaderValue for a reader
	Mode  Mode   // Read for a reader (RLock), Write for anyone else
	// Owner is the identity the holder's session recorded; empty for etcd's
	// own lock code, older versions, or a lease gone meanwhile.
	Owner string
}

// Inspect reads the queue of the lock or election name: the holder first,
// then the waiters in the order they will be granted; other keys under the
// name are left out. The queue is one snapshot; TTLs and owners are read
// just after it, so an entry whose lease ended meanwhile has TTL 0 and no
// Owner. It is safe for concurrent use and writes nothing.
func Inspect(ctx context.Context, client *clientv3.Client, name string) ([]QueueEntry, error) {
	op := fmt.Sprintf("inspect %q", name)
	if client == nil {
		return nil, failed(op, errNilClient)
	}
	if err := validateName(name); err != nil {
		return nil, failed(op, err)
	}
	pfx := name + "/"
	resp, err := client.Get(ctx, pfx, clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, failed(op, err)
	}
	var entries []QueueEntry
	for _, kv := range resp.Kvs {
		if isQueueKey(pfx, kv) {
			entries = append(entries, QueueEntry{Key: string(kv.Key), Token: kv.CreateRevision,
				Lease: clientv3.LeaseID(kv.Lease), Value: string(kv.Value), Mode: modeOf(kv)})
		}
	}
	if err := fillTTLs(ctx, client, entries); err != nil {
		return nil, failed(op, err)
	}
	return entries, nil
}

// Holding is how many entries at the head of Inspect's queue hold the
// lock: a writer alone, or every reader before the first writer.
func Holding(entries []QueueEntry) int {
	if len(entries) == 0 || entries[0].Mode == Write {
		return min(len(entries), 1)
	}
	n := 0
	for n < len(entries) && entries[n].Mode == Read {
		n++
	}
	return n
}

// fillTTLs reads each entry's TTL, then its owner, all entries at once.
func fillTTLs(ctx context.Context, client *clientv3.Client, entries []QueueEntry) error {
	errs := make([]error, len(entries))
	var wg sync.WaitGroup
	for i := range entries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.TimeToLive(ctx, entries[i].Lease)
			if err != nil {
				errs[i] = err
				return
			}
			entries[i].TTL = max(time.Duration(resp.TTL)*time.Second, 0)
			entries[i].Owner, errs[i] = readOwner(ctx, client, entries[i].Lease)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// DelayRecord is a name's lock-delay record (WithLockDelay), as
// InspectDelay reads it.
type DelayRecord struct {
	// State is "held", "lost" or "released"; empty if the name has no
	// record (or one this package did not write).
	State string
	Token int64 // the holding the record names
	// Delay is, for "held", what the holding asks of its successors if
	// it is lost; for "lost", the delay being waited out. 0 if the record
	// does not say (an older version's).
	Delay time.Duration
	// Left is, for "lost", how long the wait has left, as etcd counts it
	// (whole seconds); 0 once it has lapsed.
	Left time.Duration
}

// InspectDelay reads the lock-delay record of name. A "lost" record names
// the holding whose loss the head of the queue is waiting out. It writes
// nothing.
func InspectDelay(ctx context.Context, client *clientv3.Client, name string) (DelayRecord, error) {
	op := fmt.Sprintf("inspect delay %q", name)
	if client == nil {
		return DelayRecord{}, failed(op, errNilClient)
	}
	if err := validateName(name); err != nil {
		return DelayRecord{}, failed(op, err)
	}
	resp, err := client.Get(ctx, DelayRecordKey(name))
	if err != nil {
		return DelayRecord{}, failed(op, err)
	}
	rec := delayrec.Parse(keywrite.FirstKV(resp.Kvs))
	if rec.State == delayrec.Clear {
		return DelayRecord{}, nil
	}
	out := DelayRecord{State: rec.State.String(), Token: rec.Token, Delay: max(rec.Delay, 0)}
	if rec.State == delayrec.Lost && rec.Lease != 0 {
		if out.Left, err = leaseLeft(ctx, client, rec.Lease); err != nil {
			return DelayRecord{}, failed(op, err)
		}
	}
	return out, nil
}
