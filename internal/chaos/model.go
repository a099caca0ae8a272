package chaos

import (
	"fmt"
	"sort"

	"github.com/anishathalye/porcupine"
)

// Register kinds: how a register's writes are guarded. A Held guard may
// refuse a write the token order would allow (the holder has since let go),
// so its refusals are always legal; a Resource, SQL or manifest fence
// refuses exactly the writes whose token is below the highest accepted.
const (
	KindHeld     = "held"
	KindResource = "resource"
	KindSQL      = "sql"
	// KindManifest is a manifest object on an S3 store, committed through
	// objectfence: its value is the manifest's payload.
	KindManifest = "manifest"
)

// Outcome of an operation.
type Outcome int

// The outcomes.
const (
	OK      Outcome = iota // the write was applied, or the read returned Value
	Refused                // the fence refused the write; nothing changed
	Unknown                // no answer: the write may or may not have been applied
	// Failed: the write ended unapplied, and not for its token (a manifest
	// commit that objectfence reports as contended, refused by the store,
	// or failed in the read before its put). Legal in any state, and it
	// changes nothing: a value it wrote after all would show in reads.
	Failed
)

// Input is an operation on one register.
type Input struct {
	Register string
	Kind     string
	Write    bool
	Token    int64  // for writes
	Value    string // for writes
	// Claim: a manifest claim, a write that raises the token and keeps
	// the value (Value is empty).
	Claim bool
}

// Output is how an operation ended.
type Output struct {
	Outcome Outcome
	Value   string // what a read returned
}

// registerState is one register in the model: the highest token accepted
// and the value last written.
type registerState struct {
	highest int64
	value   string
}

// Model returns the fenced register: a write is accepted iff its token is at
// least the highest accepted so far (a Held register may also refuse); a
// read returns the last accepted value. Histories are partitioned by
// register.
func Model() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			byReg := map[string][]porcupine.Operation{}
			for _, op := range history {
				r := op.Input.(Input).Register
				byReg[r] = append(byReg[r], op)
			}
			keys := make([]string, 0, len(byReg))
			for k := range byReg {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			out := make([][]porcupine.Operation, 0, len(keys))
			for _, k := range keys {
				out = append(out, byReg[k])
			}
			return out
		},
		Init:  func() []interface{} { return []interface{}{registerState{}} },
		Step:  step,
		Equal: func(a, b interface{}) bool { return a.(registerState) == b.(registerState) },
		DescribeOperation: func(input, output interface{}) string {
			in, out := input.(Input), output.(Output)
			if !in.Write {
				return fmt.Sprintf("read %s -> %q", in.Register, out.Value)
			}
			if in.Claim {
				return fmt.Sprintf("%s claim %s token %d -> %s", in.Kind, in.Register, in.Token, out.Outcome)
			}
			return fmt.Sprintf("%s write %s token %d %q -> %s", in.Kind, in.Register, in.Token, in.Value, out.Outcome)
		},
		DescribeState: func(state interface{}) string {
			s := state.(registerState)
			return fmt.Sprintf("highest %d, value %q", s.highest, s.value)
		},
	}
	return nm.ToModel()
}

func (o Outcome) String() string {
	switch o {
	case OK:
		return "ok"
	case Refused:
		return "refused"
	case Unknown:
		return "unknown"
	case Failed:
		return "failed"
	}
	return "?"
}

// step is the fenced register's transition: the states an operation may
// lead to from state, none if it is impossible there.
func step(state, input, output interface{}) []interface{} {
	s, in, out := state.(registerState), input.(Input), output.(Output)
	if !in.Write {
		if out.Outcome == Unknown || out.Value == s.value {
			return []interface{}{s}
		}
		return nil
	}
	accepted := registerState{highest: in.Token, value: in.Value}
	if in.Claim {
		accepted.value = s.value
	}
	allowed := in.Token >= s.highest
	switch out.Outcome {
	case OK:
		if allowed {
			return []interface{}{accepted}
		}
	case Refused:
		if !allowed || in.Kind == KindHeld {
			return []interface{}{s}
		}
	case Unknown:
		if allowed {
			return []interface{}{s, accepted}
		}
		return []interface{}{s}
	case Failed:
		return []interface{}{s}
	}
	return nil
}
