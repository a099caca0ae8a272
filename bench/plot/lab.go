package main

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// The rtt lab's figures (BenchmarkLabUncontended, BenchmarkLabHandoff):
// latency against the round trip every link pays, beside a plain put's in
// the same run.

// labRTTs are the round trips the lab runs at, as the benchmarks name them,
// and in milliseconds for the plots.
var labRTTs = []struct {
	name string
	ms   float64
}{{"200µs", 0.2}, {"1ms", 1}, {"5ms", 5}}

var labSides = []string{"leader", "follower"}

var labContenders = []int{2, 4, 16}

// labImpls are the handoff's implementations, with the names the table and
// the plots give them.
var labImpls = []struct{ impl, label string }{
	{"leasefence", "leasefence, a client each"},
	{"keeper", "leasefence, one client and Keeper"},
	{"mutex", "concurrency.Mutex, a client each"},
}

func labHandoffName(rtt, side string, n int, impl string) string {
	return fmt.Sprintf("BenchmarkLabHandoff/rtt=%s/client=%s/contenders=%d/impl=%s", rtt, side, n, impl)
}

func labUncontendedName(rtt, side string) string {
	return fmt.Sprintf("BenchmarkLabUncontended/rtt=%s/client=%s", rtt, side)
}

// ms is the median of a benchmark's microsecond metric, in milliseconds.
func (r results) ms(name, unit string) (float64, bool) {
	v, ok := r.median(name, unit)
	return v / 1e3, ok
}

// labPlots are the lab's plots, to be written into out: a handoff plot
// per client side, and the uncontended steps.
func labPlots(r results, out string) []output {
	var outs []output
	for _, side := range labSides {
		outs = append(outs, output{filepath.Join(out, "lab-handoff-"+side+".png"),
			func(path string) error { return drawLabHandoff(r, side, path) }})
	}
	return append(outs, output{filepath.Join(out, "lab-acquire.png"), func(path string) error { return drawLabAcquire(r, path) }})
}

var (
	blue = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	teal = color.RGBA{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff}
	red  = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	gray = color.Gray{Y: 0x60}
)

var implColor = map[string]color.Color{"leasefence": blue, "keeper": teal, "mutex": red}

// contenderGlyph tells the contender counts apart on a plot.
var contenderGlyph = map[int]draw.GlyphDrawer{2: draw.CircleGlyph{}, 4: draw.BoxGlyph{}, 16: draw.TriangleGlyph{}}

// labPlot is a log-log plot of latency against round trip.
func labPlot(title, ylabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "round trip on every link (ms)"
	p.Y.Label.Text = ylabel
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.ConstantTicks([]plot.Tick{{Value: 0.2, Label: "0.2"}, {Value: 1, Label: "1"}, {Value: 5, Label: "5"}})
	var ticks []plot.Tick
	for _, v := range []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000} {
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
	}
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.ConstantTicks(ticks)
	p.Legend.Top, p.Legend.Left = true, true
	return p
}

// roomForLegend raises the top of a log plot so that the legend, at the
// top left, sits above the data.
func roomForLegend(p *plot.Plot, lines int) {
	p.Y.Max *= math.Pow(1.35, float64(lines))
}

// addSeries draws one line of points against the round trip.
func addSeries(p *plot.Plot, label string, xys plotter.XYs, c color.Color, glyph draw.GlyphDrawer, dashed bool) error {
	if len(xys) == 0 {
		return nil
	}
	l, pts, err := plotter.NewLinePoints(xys)
	if err != nil {
		return err
	}
	l.Color, pts.Color = c, c
	if glyph != nil {
		pts.Shape = glyph
	}
	if dashed {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	}
	p.Add(l, pts)
	p.Legend.Add(label, l, pts)
	return nil
}

// drawLabHandoff: handoff p50 against round trip for one side, each
// implementation at each contender count, with the same runs' plain put.
func drawLabHandoff(r results, side, path string) error {
	p := labPlot("Lock handoff p50, three etcd members, clients on the "+side+", fsync on", "Unlock call to next Lock return (ms)")
	for _, im := range labImpls {
		for _, n := range labContenders {
			var xys plotter.XYs
			for _, rtt := range labRTTs {
				if v, ok := r.ms(labHandoffName(rtt.name, side, n, im.impl), "handoff-p50-us"); ok {
					xys = append(xys, plotter.XY{X: rtt.ms, Y: v})
				}
			}
			label := fmt.Sprintf("%s, %d contenders", im.label, n)
			if err := addSeries(p, label, xys, implColor[im.impl], contenderGlyph[n], im.impl == "mutex"); err != nil {
				return err
			}
		}
	}
	var put plotter.XYs
	for _, rtt := range labRTTs {
		if v, ok := r.ms(labHandoffName(rtt.name, side, 16, "leasefence"), "put-p50-us"); ok {
			put = append(put, plotter.XY{X: rtt.ms, Y: v})
		}
	}
	if err := addSeries(p, "plain put p50, same run (16 contenders)", put, gray, draw.PlusGlyph{}, true); err != nil {
		return err
	}
	roomForLegend(p, 10)
	return p.Save(9*vg.Inch, 7*vg.Inch, path)
}

// drawLabAcquire: uncontended Lock p50 and a plain put's p50 against round
// trip, on the leader and a follower.
func drawLabAcquire(r results, path string) error {
	p := labPlot("Uncontended Lock p50, three etcd members, fsync on", "latency (ms)")
	for _, side := range labSides {
		glyph := draw.GlyphDrawer(draw.CircleGlyph{})
		if side == "follower" {
			glyph = draw.BoxGlyph{}
		}
		for _, step := range []struct {
			unit, label string
			c           color.Color
			dashed      bool
		}{
			{"lock-p50-us", "leasefence Lock", blue, false},
			{"mutex-lock-p50-us", "concurrency.Mutex Lock", red, false},
			{"put-p50-us", "plain put", gray, true},
		} {
			var xys plotter.XYs
			for _, rtt := range labRTTs {
				if v, ok := r.ms(labUncontendedName(rtt.name, side), step.unit); ok {
					xys = append(xys, plotter.XY{X: rtt.ms, Y: v})
				}
			}
			if err := addSeries(p, step.label+", client on the "+side, xys, step.c, glyph, step.dashed); err != nil {
				return err
			}
		}
	}
	roomForLegend(p, 6)
	return p.Save(8*vg.Inch, 6*vg.Inch, path)
}

// labTable is the lab's figures as Markdown: the uncontended steps as
// multiples of a plain put, then each handoff's p50 and p99 beside the
// same run's put and the goal (the put's p50 plus one one-way delay plus
// 0.2 ms), with the requests it made.
func labTable(r results) string {
	var b strings.Builder
	b.WriteString("| round trip | client | put p50 | Lock p50 (× put) | Unlock (× put) | guarded put (× put) | Mutex Lock (× put) | requests: Lock, Mutex Lock |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, rtt := range labRTTs {
		for _, side := range labSides {
			name := labUncontendedName(rtt.name, side)
			put, ok := r.ms(name, "put-p50-us")
			if !ok {
				continue
			}
			x := func(unit string) string {
				v, ok := r.median(name, unit)
				if !ok {
					return "–"
				}
				return fmt.Sprintf("%.2f", v)
			}
			fmt.Fprintf(&b, "| %s | %s | %.2f ms | %s | %s | %s | %s | %s, %s |\n", rtt.name, side, put,
				x("lock-x-put"), x("unlock-x-put"), x("guarded-put-x-put"), x("mutex-lock-x-put"), x("lock-rpcs"), x("mutex-lock-rpcs"))
		}
	}
	b.WriteString("\n| round trip | client | contenders | impl | handoff p50 | p99 | put p50, same run | goal | requests on the critical path | unary + stream msgs per handoff, all contenders |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for i, rtt := range labRTTs {
		oneWay := rtt.ms / 2
		for _, side := range labSides {
			for _, n := range labContenders {
				for _, im := range labImpls {
					name := labHandoffName(labRTTs[i].name, side, n, im.impl)
					p50, ok := r.ms(name, "handoff-p50-us")
					if !ok {
						continue
					}
					p99, _ := r.ms(name, "handoff-p99-us")
					put, _ := r.ms(name, "put-p50-us")
					unary, _ := r.median(name, "unary/op")
					msgs, _ := r.median(name, "streammsgs/op")
					crit := "–"
					if v, ok := r.median(name, "critical-rpcs"); ok {
						crit = fmt.Sprintf("%.2f", v)
					}
					fmt.Fprintf(&b, "| %s | %s | %d | %s | %.2f ms | %.2f ms | %.2f ms | %.2f ms | %s | %.1f + %.1f |\n",
						rtt.name, side, n, im.impl, p50, p99, put, put+oneWay+0.2, crit, unary, msgs)
				}
			}
		}
	}
	return b.String()
}
