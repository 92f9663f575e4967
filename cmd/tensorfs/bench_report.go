package main

// What bench reports: per point, the latency of a call at p50 and p99 and
// the bandwidth, as a table, as JSON (--json) and as a plot (--plot).

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// benchReport is bench's result, its --json document.
type benchReport struct {
	// Mount is the local mountpoint.
	Mount string `json:"mount"`
	// Node is its node name, absent when the mount's source does not say.
	Node string `json:"node,omitempty"`
	// Peer is the peer copied to and from; absent for copies inside the
	// mount.
	Peer string `json:"peer,omitempty"`
	// Batch is the descriptors per call.
	Batch int `json:"batch"`
	// Iters is the timed calls per point (--iters); absent with --time.
	Iters int `json:"iters,omitempty"`
	// TimeS is how long each point ran its timed calls (--time), in
	// seconds; absent with --iters.
	TimeS float64 `json:"time_s,omitempty"`
	// Results are the points, by mode, then size, then direction.
	Results []benchResult `json:"results"`
}

// benchResult is one point: one mode and direction at one size.
type benchResult struct {
	// Mode is "inplace" (ranges into existing tensors) or "whole"
	// (replacing tensors).
	Mode string `json:"mode"`
	// Dir is "push" (copy_to on the local tensor) or "pull" (copy_from on
	// it, or a batch on the root for several whole tensors).
	Dir string `json:"dir"`
	// Size is the bytes of one descriptor.
	Size int64 `json:"size"`
	// Batch is the descriptors per call.
	Batch int `json:"batch"`
	// BytesPerCall is Size x Batch.
	BytesPerCall int64 `json:"bytes_per_call"`
	// Calls is how many timed calls ran.
	Calls int `json:"calls"`
	// WritesPerCall is the setxattr calls one call took (more than 1 when
	// its value was over the kernel's 64 KiB limit and was split).
	WritesPerCall int `json:"writes_per_call"`
	// P50US is the latency of one call at the 50th percentile (nearest
	// rank: a call's own time, never an interpolation), in microseconds.
	P50US float64 `json:"p50_us"`
	// P99US is the latency at the 99th percentile, in microseconds (the
	// slowest call when there are fewer than 100).
	P99US float64 `json:"p99_us"`
	// MeanUS is the mean latency, in microseconds: GBPerS's reciprocal,
	// scaled by BytesPerCall.
	MeanUS float64 `json:"mean_us"`
	// GBPerS is the bandwidth: bytes moved by the timed calls over the
	// time spent in them, in 10^9 bytes a second.
	GBPerS float64 `json:"gb_per_s"`
	// Path is the way the daemon copied ("local", "ipc" or "tcp"), from
	// its record of the last timed call; absent when stats had none.
	Path string `json:"path,omitempty"`
	// Checked is how many calls had their bytes read back and compared.
	Checked int `json:"checked"`
}

// summarize makes a point's result from its calls' latencies (at least
// one); writes is the setxattr calls of one call.
func summarize(ph benchPhase, dir string, lat []time.Duration, writes int) benchResult {
	sorted := slices.Clone(lat)
	slices.Sort(sorted)
	var sum time.Duration
	for _, d := range sorted {
		sum += d
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	r := benchResult{
		Mode: ph.mode, Dir: dir, Size: ph.size, Batch: ph.n, BytesPerCall: ph.total(),
		Calls: len(lat), WritesPerCall: writes,
		P50US: us(percentile(sorted, 50)), P99US: us(percentile(sorted, 99)),
		MeanUS: us(sum) / float64(len(lat)),
	}
	if sum > 0 {
		r.GBPerS = float64(ph.total()) * float64(len(lat)) / sum.Seconds() / 1e9
	}
	return r
}

// percentile is the p-th percentile of sorted (ascending, not empty) by
// nearest rank: the smallest value with at least p% of them at or below
// it, so p99 of 10 calls is the slowest one, never an interpolation
// between calls.
func percentile(sorted []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// latencyText is a latency in µs, ms or s, three or four significant
// digits, as the table shows it.
func latencyText(us float64) string {
	switch {
	case us < 1000:
		return fmt.Sprintf("%.1f µs", us)
	case us < 1e6:
		return fmt.Sprintf("%.2f ms", us/1e3)
	}
	return fmt.Sprintf("%.3f s", us/1e6)
}

// benchTitle is the report's first line: where it ran and how.
func benchTitle(r *benchReport) string {
	from := r.Mount
	if r.Node != "" {
		from += " (" + r.Node + ")"
	}
	to := "inside the mount"
	if r.Peer != "" {
		to = "to and from " + r.Peer
	}
	per := fmt.Sprintf("%d timed calls", r.Iters)
	if r.Iters == 0 {
		per = fmt.Sprintf("calls for %v", time.Duration(r.TimeS*float64(time.Second)))
	}
	return fmt.Sprintf("tensorfs bench %s, %s: %d %s per call, %s per point", from, to, r.Batch, plural(int64(r.Batch), "descriptor"), per)
}

// writeBenchTable prints the report as a title line and a table, one row
// a point.
func writeBenchTable(w io.Writer, r *benchReport) {
	fmt.Fprintln(w, benchTitle(r))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MODE\tDIR\tSIZE\tBATCH\tCALLS\tP50\tP99\tGB/S\tPATH\tCHECKED")
	for _, x := range r.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%.3f\t%s\t%d\n", x.Mode, x.Dir, humanize.IBytes(uint64(x.Size)), x.Batch, x.Calls,
			latencyText(x.P50US), latencyText(x.P99US), x.GBPerS, orDash(x.Path), x.Checked)
	}
	tw.Flush()
}

// sizeTicks marks a log-scale size axis at the sizes measured, in IEC
// units (plot.LogTicks would label powers of ten, which no size is).
type sizeTicks []int64

// Ticks implements plot.Ticker.
func (t sizeTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for _, s := range t {
		if v := float64(s); v >= lo && v <= hi {
			ticks = append(ticks, plot.Tick{Value: v, Label: strings.ReplaceAll(humanize.IBytes(uint64(s)), ".0 ", " ")})
		}
	}
	return ticks
}

// latencyTicks marks a log-scale latency axis (in µs) at 1, 2 and 5 times
// its powers of ten, labelled as the table writes latencies (100 µs, 1 ms,
// 20 ms, 1 s); over more than two decades only the powers of ten are
// labelled, the others are minor ticks.
type latencyTicks struct{}

// Ticks implements plot.Ticker.
func (latencyTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	few := hi <= lo*100
	for dec := math.Pow(10, math.Floor(math.Log10(lo))); dec <= hi; dec *= 10 {
		for _, m := range []float64{1, 2, 5} {
			v := dec * m
			if v < lo*0.9999 || v > hi*1.0001 {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || few {
				t.Label = latencyLabel(v)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// latencyLabel is a round latency in µs as an axis label.
func latencyLabel(us float64) string {
	switch {
	case us < 1000:
		return fmt.Sprintf("%g µs", us)
	case us < 1e6:
		return fmt.Sprintf("%g ms", us/1e3)
	}
	return fmt.Sprintf("%g s", us/1e6)
}

// writeBenchPlot draws the report into the PNG file path: GB/s (top) and
// p50 latency (bottom, log scale) against size (log scale), one line per
// mode and direction. A failed write removes the file: no half image.
func writeBenchPlot(path string, r *benchReport) error {
	type series struct {
		name    string
		bw, lat plotter.XYs
	}
	var ss []*series
	var sizes []int64
	for _, x := range r.Results {
		name := x.Mode + " " + x.Dir
		i := slices.IndexFunc(ss, func(s *series) bool { return s.name == name })
		if i < 0 {
			ss = append(ss, &series{name: name})
			i = len(ss) - 1
		}
		ss[i].bw = append(ss[i].bw, plotter.XY{X: float64(x.Size), Y: x.GBPerS})
		ss[i].lat = append(ss[i].lat, plotter.XY{X: float64(x.Size), Y: max(x.P50US, 1e-3)})
		if !slices.Contains(sizes, x.Size) {
			sizes = append(sizes, x.Size)
		}
	}
	slices.Sort(sizes)
	bw, lat := plot.New(), plot.New()
	bw.Title.Text = benchTitle(r)
	bw.Title.TextStyle.Font.Size = vg.Points(10)
	bw.Y.Label.Text = "GB/s"
	bw.Y.Min = 0
	lat.Y.Label.Text = "p50 latency per call"
	lat.Y.Scale = plot.LogScale{}
	lat.Y.Tick.Marker = latencyTicks{}
	for _, p := range []*plot.Plot{bw, lat} {
		p.X.Label.Text = "bytes per descriptor"
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = sizeTicks(sizes)
		p.Add(plotter.NewGrid())
		// Both rise with size: the top left corner is where the lines
		// are not.
		p.Legend.Top, p.Legend.Left = true, true
		p.Legend.XOffs, p.Legend.YOffs = vg.Points(8), vg.Points(-4)
	}
	if len(sizes) == 1 {
		// A log axis needs a span: put the one size in the middle.
		for _, p := range []*plot.Plot{bw, lat} {
			p.X.Min, p.X.Max = float64(sizes[0])/2, float64(sizes[0])*2
		}
	}
	for i, s := range ss {
		for _, pd := range []struct {
			p   *plot.Plot
			xys plotter.XYs
		}{{bw, s.bw}, {lat, s.lat}} {
			l, pts, err := plotter.NewLinePoints(pd.xys)
			if err != nil {
				return err
			}
			l.Color, pts.Color, pts.Shape = plotutil.Color(i), plotutil.Color(i), plotutil.Shape(i)
			pd.p.Add(l, pts)
			pd.p.Legend.Add(s.name, l, pts)
		}
	}
	img := vgimg.New(8*vg.Inch, 9*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadTop: vg.Points(4), PadBottom: vg.Points(4), PadX: vg.Points(4), PadY: vg.Points(12)}
	cs := plot.Align([][]*plot.Plot{{bw}, {lat}}, tiles, dc)
	bw.Draw(cs[0][0])
	lat.Draw(cs[1][0])

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err = (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err == nil {
		err = f.Close()
	} else {
		f.Close()
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}
