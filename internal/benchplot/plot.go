// Package benchplot draws what tensorfs's benchmarks measure against size:
// bandwidth (top) and latency (bottom, log scale) against bytes (log
// scale), one line per series, into a PNG file (gonum.org/v1/plot). Both
// `tensorfs bench --plot` and scripts/bench.sh (internal/cmd/benchreport)
// draw with it, so their plots read alike.
package benchplot

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/dustin/go-humanize"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Point is one measurement: Size bytes moved (per descriptor or per
// copy), at GBPerS (10^9 bytes a second) and a latency of LatencyUS µs.
type Point struct {
	Size      int64
	GBPerS    float64
	LatencyUS float64
}

// Series is one line of both panels. Floor draws it dashed, in the colour
// of the series before it: a measurement's floor sits right after it.
type Series struct {
	Name   string
	Points []Point
	Floor  bool
}

// Write draws series into the PNG file path, titled title, the latency
// axis labelled latencyLabel ("p50 latency per call") and the size axis
// sizeLabel ("bytes per descriptor"). A failed write removes the file: no
// half image. Errors: gonum's, the file's.
func Write(path, title, sizeLabel, latencyLabel string, series []Series) error {
	var sizes []int64
	for _, s := range series {
		for _, p := range s.Points {
			if !slices.Contains(sizes, p.Size) {
				sizes = append(sizes, p.Size)
			}
		}
	}
	slices.Sort(sizes)
	bw, lat := plot.New(), plot.New()
	bw.Title.Text = title
	bw.Title.TextStyle.Font.Size = vg.Points(10)
	bw.Y.Label.Text = "GB/s"
	bw.Y.Min = 0
	lat.Y.Label.Text = latencyLabel
	lat.Y.Scale = plot.LogScale{}
	lat.Y.Tick.Marker = LatencyTicks{}
	for _, p := range []*plot.Plot{bw, lat} {
		p.X.Label.Text = sizeLabel
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = SizeTicks(sizes)
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
	ci := -1
	for _, s := range series {
		if !s.Floor || ci < 0 {
			ci++
		}
		var bwXY, latXY plotter.XYs
		for _, p := range s.Points {
			bwXY = append(bwXY, plotter.XY{X: float64(p.Size), Y: p.GBPerS})
			latXY = append(latXY, plotter.XY{X: float64(p.Size), Y: max(p.LatencyUS, 1e-3)})
		}
		for _, pd := range []struct {
			p   *plot.Plot
			xys plotter.XYs
		}{{bw, bwXY}, {lat, latXY}} {
			l, pts, err := plotter.NewLinePoints(pd.xys)
			if err != nil {
				return fmt.Errorf("series %q: %w", s.Name, err)
			}
			c := plotutil.Color(ci)
			l.Color, pts.Color, pts.Shape = c, c, plotutil.Shape(ci)
			if s.Floor {
				l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
				l.Color = fade(c)
			}
			pd.p.Add(l, pts)
			pd.p.Legend.Add(s.Name, l, pts)
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

// fade is c at 60% opacity: a floor's line under its measurement's.
func fade(c color.Color) color.Color {
	r, g, b, _ := c.RGBA()
	return color.NRGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(b >> 8), A: 153}
}

// SizeTicks marks a log-scale size axis at the sizes measured, in IEC
// units (plot.LogTicks would label powers of ten, which no size is).
type SizeTicks []int64

// Ticks implements plot.Ticker.
func (t SizeTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for _, s := range t {
		if v := float64(s); v >= lo && v <= hi {
			ticks = append(ticks, plot.Tick{Value: v, Label: strings.ReplaceAll(humanize.IBytes(uint64(s)), ".0 ", " ")})
		}
	}
	return ticks
}

// LatencyTicks marks a log-scale latency axis (in µs) at 1, 2 and 5 times
// its powers of ten, labelled as tables write latencies (100 µs, 1 ms,
// 20 ms, 1 s); over more than two decades only the powers of ten are
// labelled, the others are minor ticks.
type LatencyTicks struct{}

// Ticks implements plot.Ticker.
func (LatencyTicks) Ticks(lo, hi float64) []plot.Tick {
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
				t.Label = LatencyLabel(v)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// LatencyLabel is a round latency in µs as an axis label.
func LatencyLabel(us float64) string {
	switch {
	case us < 1000:
		return fmt.Sprintf("%g µs", us)
	case us < 1e6:
		return fmt.Sprintf("%g ms", us/1e3)
	}
	return fmt.Sprintf("%g s", us/1e6)
}
