package lease

import (
	"strconv"
	"strings"
	"testing"
	"unicode"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A name is valid iff it is not empty, does not end in "/", has no empty
// segment and no control character; a valid
// name's keys are its own queue keys, and never queue keys of another
// valid name, however the two nest.
func FuzzLockNames(f *testing.F) {
	for _, seed := range [][2]string{{"jobs", "jobs/7"}, {"a/b", "a"}, {"", "x"}, {"x/", "x"}, {"a//b", "a"}, {"é/ü", "é"}, {"a\nb", "a"}, {"a\x00", "a"}, {"a\tb", "a"}} {
		f.Add(seed[0], seed[1], int64(0x1f))
	}
	f.Fuzz(func(t *testing.T, a, b string, id int64) {
		for _, n := range []string{a, b} {
			valid := n != "" && !strings.HasSuffix(n, "/") && !strings.Contains(n, "//") &&
				strings.IndexFunc(n, unicode.IsControl) < 0
			if err := validateName(n); (err == nil) != valid {
				t.Fatalf("validateName(%q) = %v, want valid=%v", n, err, valid)
			}
		}
		if validateName(a) != nil || validateName(b) != nil {
			return
		}
		if id <= 0 {
			return // etcd's lease IDs are positive
		}
		key := lockKey(b, clientv3.LeaseID(id))
		own := &mvccpb.KeyValue{Key: []byte(key), Lease: id}
		if !isQueueKey(b+"/", own) {
			t.Fatalf("%q is not a queue key of its own name %q", key, b)
		}
		if a != b && isQueueKey(a+"/", own) {
			t.Fatalf("%q, a key of %q, counts as a queue key of %q", key, b, a)
		}
		// The queue-key rule: the same key with no lease or with another
		// lease, the name in uppercase hex, and a data key beside the lock
		// (b + "/" + a, unless a happens to be the lease in hex) are not
		// places in b's queue.
		hex := strconv.FormatInt(id, 16)
		foreign := []*mvccpb.KeyValue{
			{Key: []byte(key)},
			{Key: []byte(key), Lease: id + 1},
			{Key: []byte(b + "/" + strings.ToUpper(hex)), Lease: id},
		}
		if a != hex {
			foreign = append(foreign, &mvccpb.KeyValue{Key: []byte(b + "/" + a), Lease: id})
		}
		for _, kv := range foreign {
			if strings.ToUpper(hex) == hex && string(kv.Key) == key && kv.Lease == id {
				continue // all digits: upper and lower case are the same key
			}
			if isQueueKey(b+"/", kv) {
				t.Fatalf("%q (lease %x) counts as a queue key of %q", kv.Key, kv.Lease, b)
			}
		}
	})
}
