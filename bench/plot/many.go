package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// The many-locks figures (BenchmarkManyLocks, BenchmarkClientWatchCost):
// what each lock held at once costs, against how many are held, and what
// etcd's client spends per watch.

var (
	manySizes  = []int{10000, 100000}
	manyTakes  = []string{"serial", "concurrent"}
	manyImpls  = []struct{ impl, label string }{{"leasefence", "leasefence"}, {"mutex", "concurrency.Mutex"}}
	manyServer = []string{"process", "embedded"}
)

const manyBenchmarks = "^(BenchmarkManyLocks|BenchmarkLabManyLocks|BenchmarkClientWatchCost|BenchmarkDeletionSeen)$"

func manyName(n int, server, take, impl string) string {
	return fmt.Sprintf("BenchmarkManyLocks/n=%d/server=%s/take=%s/impl=%s", n, server, take, impl)
}

// runMany runs the many-locks benchmarks into out/manylocks.txt, or reads
// from, and draws their plot and table.
func runMany(out, from string, count int, benchtime string) error {
	r, err := gather(from, filepath.Join(out, "manylocks.txt"), func(raw string) error {
		return runBenchmarks(raw, "", manyBenchmarks, "", count, benchtime)
	})
	if err != nil {
		return err
	}
	return write([]output{
		{filepath.Join(out, "manylocks.png"), func(path string) error { return drawMany(r, path) }},
		{filepath.Join(out, "manylocks.md"), table(manyTable(r))},
	})
}

// drawMany draws heap and stack per held lock against the locks held, for
// each implementation and way of taking them.
func drawMany(r results, path string) error {
	p := plot.New()
	p.Title.Text = "Memory per lock held, one session (etcd in a process of its own; fsync off)"
	p.X.Label.Text = "locks held at once"
	p.Y.Label.Text = "heap + stack per lock"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.ConstantTicks([]plot.Tick{{Value: 1e4, Label: "10,000"}, {Value: 1e5, Label: "100,000"}})
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.ConstantTicks([]plot.Tick{
		{Value: 100, Label: "100"}, {Value: 1e3, Label: "1 KB"}, {Value: 1e4, Label: "10 KB"}, {Value: 1e5, Label: "100 KB"}})
	p.Legend.Top, p.Legend.Left = true, false // above the lines, in the empty top of the plot
	glyph := map[string]draw.GlyphDrawer{"serial": draw.CircleGlyph{}, "concurrent": draw.BoxGlyph{}}
	for _, im := range manyImpls {
		for _, take := range manyTakes {
			var xys plotter.XYs
			for _, n := range manySizes {
				if v, ok := r.median(manyName(n, "process", take, im.impl), "totalB/lock"); ok && v > 0 {
					xys = append(xys, plotter.XY{X: float64(n), Y: v})
				}
			}
			if err := addSeries(p, im.label+", taken "+take, xys, implColor[im.impl], glyph[take], take == "concurrent"); err != nil {
				return err
			}
		}
	}
	p.X.Min, p.X.Max = 7000, 140000
	p.Y.Min, p.Y.Max = 100, 100000
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}

// manyTable is the figures as Markdown: per lock held, then per watch.
func manyTable(r results) string {
	var b strings.Builder
	b.WriteString("| locks | etcd | take | impl | time to take all | goroutines/lock | heap/lock | stack/lock | total/lock |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, n := range manySizes {
		for _, server := range manyServer {
			for _, take := range manyTakes {
				for _, im := range manyImpls {
					manyRow(&b, r, n, server, take, im.impl, im.label)
				}
			}
		}
	}
	for _, im := range manyImpls {
		name := fmt.Sprintf("BenchmarkLabManyLocks/n=10000/rtt=1ms/take=concurrent/impl=%s", im.impl)
		if took, ok := r.median(name, "s-to-take-all"); ok {
			fmt.Fprintf(&b, "| 10000 | lab, 1 ms | concurrent | %s | %.1f s | %s | %s | %s | %s |\n", im.label, took,
				figure(r, name, "goroutines/lock", "%.4f"), kb(r, name, "heapB/lock"),
				kb(r, name, "stackB/lock"), kb(r, name, "totalB/lock"))
		}
	}
	b.WriteString("\n| other locks held | deletion seen, p50 | p99 |\n|---|---|---|\n")
	for _, held := range []int{1, 10000} {
		name := fmt.Sprintf("BenchmarkDeletionSeen/held=%d", held)
		if _, ok := r.median(name, "p50-µs"); ok {
			fmt.Fprintf(&b, "| %d | %s µs | %s µs |\n", held-1, figure(r, name, "p50-µs", "%.0f"), figure(r, name, "p99-µs", "%.0f"))
		}
	}
	b.WriteString("\n| watches | etcd | api | time to open all | goroutines/watch | heap/watch | stack/watch | total/watch |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, server := range manyServer {
		for _, api := range []string{"clientv3", "grpc-stream"} {
			name := fmt.Sprintf("BenchmarkClientWatchCost/n=10000/server=%s/api=%s", server, api)
			took, ok := r.median(name, "s-to-open-all")
			if !ok {
				continue
			}
			fmt.Fprintf(&b, "| 10000 | %s | %s | %.2f s | %s | %s | %s | %s |\n", server, api, took,
				figure(r, name, "goroutines/watch", "%.3f"), kb(r, name, "heapB/watch"),
				kb(r, name, "stackB/watch"), kb(r, name, "totalB/watch"))
		}
	}
	return b.String()
}

// manyRow is one row of the per-lock table, if the run has its figures.
func manyRow(b *strings.Builder, r results, n int, server, take, impl, label string) {
	name := manyName(n, server, take, impl)
	took, ok := r.median(name, "s-to-take-all")
	if !ok {
		return
	}
	fmt.Fprintf(b, "| %d | %s | %s | %s | %.1f s | %s | %s | %s | %s |\n", n, server, take, label, took,
		figure(r, name, "goroutines/lock", "%.4f"), kb(r, name, "heapB/lock"),
		kb(r, name, "stackB/lock"), kb(r, name, "totalB/lock"))
}

// figure is a median formatted, or a dash.
func figure(r results, name, unit, format string) string {
	v, ok := r.median(name, unit)
	if !ok {
		return "–"
	}
	return fmt.Sprintf(format, v)
}

// kb is a median byte count in KB, or a dash. A count below zero (what
// was freed meanwhile outweighed what the locks hold, by a few bytes per
// lock) is shown as 0.
func kb(r results, name, unit string) string {
	v, ok := r.median(name, unit)
	if !ok {
		return "–"
	}
	return fmt.Sprintf("%.2f KB", max(v, 0)/1000)
}
