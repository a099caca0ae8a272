package bench

import (
	"slices"
	"testing"
	"time"
)

// turn is one implementation's operation in an interleaved benchmark.
type turn struct {
	name string
	op   func() error
}

// interleave runs each turn once per iteration, starting with a different
// one each time, and reports each one's median latency (name-µs) and its
// ratio to the first turn's (name/first). Separate benchmarks of two
// implementations run minutes apart, and this machine drifts by more than
// the differences measured here; taken in turns, both see the same drift.
func interleave(b *testing.B, turns []turn) {
	b.Helper()
	lat := make([][]time.Duration, len(turns))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range turns {
			k := (i + j) % len(turns)
			start := time.Now()
			if err := turns[k].op(); err != nil {
				b.Fatalf("%s: %v", turns[k].name, err)
			}
			lat[k] = append(lat[k], time.Since(start))
		}
	}
	b.StopTimer()
	names := make([]string, len(turns))
	for k, t := range turns {
		names[k] = t.name
	}
	reportMedians(b, names, lat)
}

// reportMedians reports each name's median latency (name-µs) and its ratio
// to the first's (name/first).
func reportMedians(b *testing.B, names []string, lat [][]time.Duration) {
	base := median(lat[0])
	for k, name := range names {
		m := median(lat[k])
		b.ReportMetric(float64(m.Nanoseconds())/1e3, name+"-µs")
		if k > 0 {
			b.ReportMetric(float64(m)/float64(base), name+"/"+names[0])
		}
	}
}

// median is the middle of d (sorted in place).
func median(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}
