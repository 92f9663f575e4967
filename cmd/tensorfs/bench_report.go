package main

// What bench reports: per point, the latency of a call at p50 and p99 and
// the bandwidth, as a table, as JSON (--json) and as a plot (--plot).

import (
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/tensorfs/tensorfs/internal/benchplot"
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

// writeBenchPlot draws the report into the PNG file path
// (internal/benchplot): GB/s and p50 latency against size, one line per
// mode and direction. A failed write removes the file: no half image.
func writeBenchPlot(path string, r *benchReport) error {
	var ss []benchplot.Series
	for _, x := range r.Results {
		name := x.Mode + " " + x.Dir
		i := slices.IndexFunc(ss, func(s benchplot.Series) bool { return s.Name == name })
		if i < 0 {
			ss = append(ss, benchplot.Series{Name: name})
			i = len(ss) - 1
		}
		ss[i].Points = append(ss[i].Points, benchplot.Point{Size: x.Size, GBPerS: x.GBPerS, LatencyUS: x.P50US})
	}
	return benchplot.Write(path, benchTitle(r), "bytes per descriptor", "p50 latency per call", ss)
}
