package lease

import "testing"

// regValue is a registry entry under test.
type regValue struct{ name string }

// The idle timer's expire may run late: as a user joins (its Stop came
// too late), twice for one entry (Reset after it fired), or after the
// entry was dropped and made again. Each time the entry in use, or the
// new one, stays; nothing is shut twice.
func TestRegistryLateExpire(t *testing.T) {
	var r registry[*regValue]
	shut := map[*regValue]int{}
	r.open = func(name string) (*regValue, error) { return &regValue{name: name}, nil }
	r.shut = func(v *regValue) { shut[v]++ }
	entry := func() *entry[*regValue] {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.m["n"]
	}

	v, leave, _ := r.join("n")
	e := entry()
	leave()
	_, leave, _ = r.join("n") // joins as the timer fires
	r.expire("n", e)
	if shut[v] != 0 || entry() != e {
		t.Fatalf("an entry in use was dropped by a late expire (shut %d)", shut[v])
	}
	leave()
	r.expire("n", e) // the timer, reset by that leave, fires
	r.expire("n", e) // ... and its first firing comes late
	if shut[v] != 1 || entry() != nil {
		t.Fatalf("an idle entry shut %d times, still registered: %v", shut[v], entry() != nil)
	}
	v2, leave2, _ := r.join("n")
	e2 := entry()
	r.expire("n", e) // yet another late firing for the old entry
	if v2 == v || shut[v2] != 0 || entry() == nil {
		t.Fatal("a late expire of the old entry dropped the new one")
	}
	leave2()
	r.close()
	if shut[v2] != 1 {
		t.Fatalf("close shut the idle entry %d times", shut[v2])
	}
	r.expire("n", e2) // after close: nothing left to drop
	if shut[v2] != 1 {
		t.Fatal("an expire after close shut again")
	}
}
