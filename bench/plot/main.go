// Command plot runs the side-by-side benchmarks of package bench and draws
// them: handoffs per second against contenders (this library,
// concurrency.Mutex and the commit bound; fsync off and on; one shared
// client and a client each) and the distribution of acquire latency. It
// keeps the raw `go test -bench` output beside the pictures, for benchstat.
// It belongs to the bench module (bench/go.mod), so that the library's users
// do not inherit its plotting dependencies; run it from bench/:
//
//	go run ./plot -out results                          # run, then draw
//	go run ./plot -out results -from results/raw.txt    # draw from earlier output
//	go run ./plot -lab -out results -count 3 -benchtime 200x
//	                                                    # the rtt lab's benchmarks: lab.txt, lab-*.png, lab.md
//	go run ./plot -many -out results -count 1 -benchtime 1x
//	                                                    # many locks held at once: manylocks.txt, .png, .md
//
// The lab's benchmarks start three etcd processes behind delayed links
// and take tens of minutes; they run only with -lab. The many-locks
// benchmarks take 100,000 locks at a time, minutes each; they run only
// with -many.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

func main() {
	out := flag.String("out", "results", "directory for raw output, latency samples and pictures")
	from := flag.String("from", "", "draw from this raw benchmark output instead of running the benchmarks")
	bench := flag.String("bench", ".", "benchmarks to run")
	count := flag.Int("count", 6, "runs of each benchmark")
	benchtime := flag.String("benchtime", "2s", "time (or iterations, Nx) per run")
	lab := flag.Bool("lab", false, "run (or draw from -from) the rtt lab's benchmarks instead")
	many := flag.Bool("many", false, "run (or draw from -from) the many-locks benchmarks instead")
	flag.Parse()
	var err error
	switch {
	case *lab:
		err = runLab(*out, *from, *count, *benchtime)
	case *many:
		err = runMany(*out, *from, *count, *benchtime)
	default:
		err = run(*out, *from, *bench, *count, *benchtime)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
}

func run(out, from, bench string, count int, benchtime string) error {
	latencyDir, err := filepath.Abs(filepath.Join(out, "latency")) // go test runs in the package's directory
	if err != nil {
		return err
	}
	if err := os.MkdirAll(latencyDir, 0o755); err != nil {
		return err
	}
	r, err := gather(from, filepath.Join(out, "raw.txt"), func(raw string) error {
		return runBenchmarks(raw, latencyDir, bench, "BenchmarkLab|"+manyBenchmarks, count, benchtime)
	})
	if err != nil {
		return err
	}
	var outs []output
	for _, fsync := range []string{"off", "on"} {
		outs = append(outs, output{filepath.Join(out, "handoff-fsync-"+fsync+".png"),
			func(path string) error { return drawHandoffs(r, fsync, path) }})
	}
	outs = append(outs,
		output{filepath.Join(out, "acquire-latency.png"), func(path string) error { return drawLatency(latencyDir, path) }},
		output{filepath.Join(out, "ratios.md"), table(ratios(r))})
	return write(outs)
}

// benchPackage is the package of the benchmarks, named by its import path
// so that the command works from any directory of the bench module.
const benchPackage = "github.com/leasefence/leasefence/bench"

// runLab runs the rtt lab's benchmarks into out/lab.txt, or reads from,
// and draws their plots and table.
func runLab(out, from string, count int, benchtime string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	r, err := gather(from, filepath.Join(out, "lab.txt"), func(raw string) error {
		return runBenchmarks(raw, "", "BenchmarkLab", "", count, benchtime)
	})
	if err != nil {
		return err
	}
	return write(append(labPlots(r, out), output{filepath.Join(out, "lab.md"), table(labTable(r))}))
}

// output is one file the command writes: a plot, or a table.
type output struct {
	path string
	make func(path string) error
}

// write makes each output in turn and says so.
func write(outs []output) error {
	for _, o := range outs {
		if err := o.make(o.path); err != nil {
			return err
		}
		fmt.Println("wrote", o.path)
	}
	return nil
}

// table is an output's maker that writes text.
func table(text string) func(path string) error {
	return func(path string) error { return os.WriteFile(path, []byte(text), 0o644) }
}

// gather parses the benchmark output in from, or, with no from, runs
// the benchmarks into raw first.
func gather(from, raw string, runInto func(raw string) error) (results, error) {
	if from != "" {
		return parse(from)
	}
	if err := runInto(raw); err != nil {
		return nil, err
	}
	return parse(raw)
}

// runBenchmarks runs the benchmarks bench, but not skip, teeing their
// output to raw.
func runBenchmarks(raw, latencyDir, bench, skip string, count int, benchtime string) error {
	f, err := os.Create(raw)
	if err != nil {
		return err
	}
	defer f.Close()
	args := []string{"test", "-run", "^$", "-bench", bench, "-benchtime", benchtime,
		"-count", strconv.Itoa(count), "-timeout", "3h"}
	if skip != "" {
		args = append(args, "-skip", skip)
	}
	args = append(args, benchPackage)
	if latencyDir != "" {
		args = append(args, "-args", "-latency-dir", latencyDir)
	}
	cmd := exec.Command("go", args...)
	cmd.Stdout = io.MultiWriter(os.Stdout, f)
	cmd.Stderr = os.Stderr
	return cmd.Run()
}

// results maps a benchmark name (without the -N suffix) and a unit to the
// values of every run.
type results map[string]map[string][]float64

var line = regexp.MustCompile(`^(Benchmark\S+?)(-\d+)?\s+\d+\s+(.*)$`)

func parse(path string) (results, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := results{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		fields := strings.Fields(m[3])
		for i := 0; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				continue
			}
			if r[m[1]] == nil {
				r[m[1]] = map[string][]float64{}
			}
			r[m[1]][fields[i+1]] = append(r[m[1]][fields[i+1]], v)
		}
	}
	if len(r) == 0 {
		return nil, fmt.Errorf("no benchmark results in %s", path)
	}
	return r, sc.Err()
}

// median of the runs of name in unit; false if there are none.
func (r results) median(name, unit string) (float64, bool) {
	vs := append([]float64(nil), r[name][unit]...)
	if len(vs) == 0 {
		return 0, false
	}
	sort.Float64s(vs)
	return vs[len(vs)/2], true
}

var contenders = []int{1, 4, 16, 256}

var shapeLabel = map[string]string{"shared": "one shared client", "each": "a client each"}

func handoffName(fsync, shape string, n int, impl string) string {
	return fmt.Sprintf("BenchmarkHandoff/fsync=%s/shape=%s/contenders=%d/impl=%s", fsync, shape, n, impl)
}

// drawHandoffs draws sections per second against contenders for one fsync
// mode, with the commit bound as a flat line.
func drawHandoffs(r results, fsync, path string) error {
	p := plot.New()
	p.Title.Text = "Lock handoffs per second, fsync " + fsync + " (one embedded etcd, 2 cores)"
	p.X.Label.Text = "contenders on one lock name"
	p.Y.Label.Text = "handoffs per second"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = false, false
	series := []struct {
		impl, shape string
		c           color.Color
		dashed      bool
	}{
		{"leasefence", "shared", color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, false},
		{"leasefence", "each", color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, true},
		{"concurrency.Mutex", "shared", color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, false},
		{"concurrency.Mutex", "each", color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, true},
	}
	for _, s := range series {
		var xys plotter.XYs
		for _, n := range contenders {
			if v, ok := r.median(handoffName(fsync, s.shape, n, s.impl), "sections/s"); ok {
				xys = append(xys, plotter.XY{X: float64(n), Y: v})
			}
		}
		if len(xys) == 0 {
			continue
		}
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return err
		}
		l.Color, pts.Color = s.c, s.c
		if s.dashed {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			pts.Shape = draw.BoxGlyph{}
		}
		p.Add(l, pts)
		p.Legend.Add(s.impl+", "+shapeLabel[s.shape], l, pts)
	}
	if bound, ok := r.median("BenchmarkCommitBound/fsync="+fsync, "puts/s"); ok {
		l, err := plotter.NewLine(plotter.XYs{{X: 1, Y: bound}, {X: 256, Y: bound}})
		if err != nil {
			return err
		}
		l.Color = color.Gray{Y: 0x60}
		l.Dashes = []vg.Length{vg.Points(1), vg.Points(3)}
		p.Add(l)
		p.Legend.Add("commit bound (1 / median plain put)", l)
	}
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}

// drawLatency draws the distribution (CDF) of acquire latency at 4 and 16
// contenders on one shared client, fsync off, for both implementations.
func drawLatency(dir, path string) error {
	p := plot.New()
	p.Title.Text = "Acquire latency, fsync off, one shared client"
	p.X.Label.Text = "time from Lock to held (ms)"
	p.Y.Label.Text = "fraction of acquisitions"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	// In the empty middle: the fast curves rise on the left, the slow on
	// the right.
	p.Legend.Top, p.Legend.Left = false, false
	p.Legend.XOffs, p.Legend.YOffs = -vg.Inch, 1.5*vg.Inch
	colors := map[string]color.Color{
		"leasefence":        color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
		"concurrency.Mutex": color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	}
	drawn := 0
	for _, n := range []int{4, 16} {
		for _, impl := range []string{"leasefence", "concurrency.Mutex"} {
			name := sanitize(handoffName("off", "shared", n, impl))
			samples, err := readSamples(filepath.Join(dir, name+".txt"))
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return err
			}
			l, err := plotter.NewLine(cdf(samples))
			if err != nil {
				return err
			}
			l.Color = colors[impl]
			if n == 16 {
				l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			}
			p.Add(l)
			p.Legend.Add(fmt.Sprintf("%s, %d contenders", impl, n), l)
			drawn++
		}
	}
	if drawn == 0 {
		return fmt.Errorf("no latency samples in %s", dir)
	}
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}

// sanitize is the file name the benchmarks give a benchmark's samples.
func sanitize(name string) string {
	return strings.NewReplacer("/", "_", "=", "_", " ", "_").Replace(name)
}

func readSamples(path string) ([]float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		ns, err := strconv.ParseFloat(sc.Text(), 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, ns/1e6)
	}
	return out, sc.Err()
}

// cdf gives at most 500 points of the empirical distribution of samples.
func cdf(samples []float64) plotter.XYs {
	sort.Float64s(samples)
	step := max(1, len(samples)/500)
	var xys plotter.XYs
	for i := 0; i < len(samples); i += step {
		xys = append(xys, plotter.XY{X: math.Max(samples[i], 1e-3), Y: float64(i+1) / float64(len(samples))})
	}
	return xys
}

// ratios is a Markdown table of the handoff figures: sections per second of
// both implementations, their ratio, and this library's share of the
// commit bound.
func ratios(r results) string {
	var b strings.Builder
	b.WriteString("| fsync | shape | contenders | leasefence/s | Mutex/s | × Mutex | % of commit bound | requests per handoff (unary + stream) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, fsync := range []string{"off", "on"} {
		for _, shape := range []string{"shared", "each"} {
			for _, n := range contenders {
				ours, ok := r.median(handoffName(fsync, shape, n, "leasefence"), "sections/s")
				if !ok {
					continue
				}
				theirs, _ := r.median(handoffName(fsync, shape, n, "concurrency.Mutex"), "sections/s")
				share, _ := r.median(handoffName(fsync, shape, n, "leasefence"), "%bound")
				unary, _ := r.median(handoffName(fsync, shape, n, "leasefence"), "unary/op")
				msgs, _ := r.median(handoffName(fsync, shape, n, "leasefence"), "streammsgs/op")
				times := "–"
				if theirs > 0 {
					times = fmt.Sprintf("%.1f×", ours/theirs)
				}
				fmt.Fprintf(&b, "| %s | %s | %d | %.0f | %.0f | %s | %.0f%% | %.1f + %.1f |\n",
					fsync, shape, n, ours, theirs, times, share, unary, msgs)
			}
		}
	}
	return b.String()
}
