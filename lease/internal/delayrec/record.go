package delayrec

import (
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// State is what a record says of the holding it names.
type State int

const (
	Clear    State = iota // no record, or one this package did not write
	Held                  // the holding took the name and has not let go cleanly
	Lost                  // the holding was lost; the record's lease times the delay
	Released              // the holding let go cleanly: no delay
)

var words = map[State]string{Held: "held", Lost: "lost", Released: "released"}

// Unknown is the Delay of a record written before records said it (a
// "held T" or "lost T" of an older version).
const Unknown time.Duration = -1

// Record is a name's delay record as read.
type Record struct {
	State State
	Token int64 // the holding it is about
	// Delay is, for Held, what the holding asks of whoever follows it if
	// it is lost; for Lost, what is being waited out. Unknown if the
	// record does not say.
	Delay  time.Duration
	Lease  clientv3.LeaseID // the lease the record is attached to; 0 for none
	ModRev int64            // the record's mod revision; 0 when there is none
	// Left is, for a record this lock wrote, how long its lease had; 0
	// if not known.
	Left time.Duration
}

// Format is the value of a record: "held T D", "lost T D" or
// "released T", with D as time.Duration prints it.
func Format(state State, token int64, delay time.Duration) string {
	s := words[state] + " " + strconv.FormatInt(token, 10)
	if state == Released {
		return s
	}
	return s + " " + delay.String()
}

// Parse reads kv; nil, or a value this package did not write, is Clear.
func Parse(kv *mvccpb.KeyValue) Record {
	if kv == nil {
		return Record{}
	}
	r := Record{ModRev: kv.ModRevision, Lease: clientv3.LeaseID(kv.Lease)}
	fields := strings.Fields(string(kv.Value))
	if len(fields) < 2 || len(fields) > 3 {
		return r
	}
	token, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil || token <= 0 {
		return r
	}
	delay := Unknown
	if len(fields) == 3 {
		if delay, err = time.ParseDuration(fields[2]); err != nil || delay < 0 {
			return r
		}
	}
	for state, w := range words {
		if w == fields[0] {
			r.State, r.Token, r.Delay = state, token, delay
		}
	}
	return r
}

// String is the state's word in a record: "held", "lost" or "released";
// empty for Clear.
func (s State) String() string { return words[s] }
