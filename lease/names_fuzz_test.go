package lease

import (
	"strings"
	"testing"
	"unicode"

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
		key := lockKey(b, clientv3.LeaseID(id))
		if !isQueueKey(b+"/", []byte(key)) {
			t.Fatalf("%q is not a queue key of its own name %q", key, b)
		}
		if a != b && isQueueKey(a+"/", []byte(key)) {
			t.Fatalf("%q, a key of %q, counts as a queue key of %q", key, b, a)
		}
	})
}
