// Command benchreport turns the rounds of scripts/bench.sh into one result:
// every row of the performance table (rows.go) as the median, minimum and
// maximum over the rounds of the tensorfs figure, of its floor measured in
// the same round, and of their per-round ratio, with the row's goal and
// whether the median ratio meets it; the machine it ran on; the in-place
// sweep drawn against size (internal/benchplot).
//
// Usage:
//
//	benchreport -out DIR [-commit C] [-quick] [-gpu] [-without ID-PREFIX] [-skipped REASON] [-strict] ROUND...
//	benchreport -compare RESULT-DIR...
//
// Each ROUND is the raw `go test -bench` output of one round (one test
// process per benchmark set, in Go's benchmark format, read with
// golang.org/x/perf/benchfmt). A "tensorfs-device: NAME" configuration
// line says which device the results after it ran on (default host);
// GPU floors come as a "BenchmarkGPUFloor" line (scripts/bench.sh makes it
// from scripts/gpu_floor.py). It writes DIR/result.json, DIR/table.md
// (also printed) and DIR/sweep.png.
//
// -compare prints, from the result.json of each RESULT-DIR, one markdown
// table of every row with a floor or a goal: its goal, then for each
// result the median ratio and whether it meets the goal (the table of
// docs/performance.md).
//
// Exit status: 1 when a row that should have run has no result in some
// round (a benchmark that failed or was not run, or gave a figure of 0 or
// less), a round has no benchmark result or a figure that is not finite,
// there is no in-place sweep to draw, or the files cannot be written; 2
// with -strict when a goal is missed; else 0.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/perf/benchfmt"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/internal/benchplot"
)

// Result is result.json.
type Result struct {
	// Schema is this layout's version (1).
	Schema int `json:"schema"`
	// Date is when the report was made (RFC 3339, UTC).
	Date string `json:"date"`
	// Commit is the tensorfs commit measured (git describe --always
	// --dirty), as bench.sh gives it.
	Commit  string  `json:"commit"`
	Machine Machine `json:"machine"`
	// Quick: a bench.sh --quick run (smaller sizes, one round): a smoke
	// test, not figures to quote.
	Quick  bool `json:"quick"`
	Rounds int  `json:"rounds"`
	// Skipped says what did not run and why (the GPU rows on a host
	// without one).
	Skipped []string `json:"skipped,omitempty"`
	Rows    []Row    `json:"rows"`
	// Sweep is the in-place sweep by path, points in ascending size.
	Sweep map[string][]SweepPoint `json:"sweep"`
}

// Machine says where the run was.
type Machine struct {
	Hostname  string  `json:"hostname"`
	CPUs      int     `json:"cpus"`
	CPUModel  string  `json:"cpu_model"`
	Kernel    string  `json:"kernel"`
	MemoryGiB float64 `json:"memory_gib"`
	// GPU and Driver are nvidia-smi's, empty without a GPU.
	GPU    string `json:"gpu,omitempty"`
	Driver string `json:"driver,omitempty"`
	// Go is the toolchain that built the benchmarks (this report's).
	Go string `json:"go"`
}

// Stat is a figure over the rounds.
type Stat struct {
	Median float64   `json:"median"`
	Min    float64   `json:"min"`
	Max    float64   `json:"max"`
	Rounds []float64 `json:"rounds"`
}

// Row is one row of the table. Value and Floor are in Unit; Ratio is per
// round, tensorfs/floor (floor/tensorfs where Better is "faster").
type Row struct {
	ID        string  `json:"id"`
	Group     string  `json:"group"`
	What      string  `json:"what"`
	Unit      string  `json:"unit"`
	Better    string  `json:"better"`
	Value     *Stat   `json:"value,omitempty"`
	Floor     *Stat   `json:"floor,omitempty"`
	FloorWhat string  `json:"floor_what,omitempty"`
	Ratio     *Stat   `json:"ratio,omitempty"`
	Goal      float64 `json:"goal,omitempty"`
	// Met is "yes", "no", "" (no goal) or "missing" (no result).
	Met string `json:"met"`
}

// SweepPoint is one size of the sweep, medians over the rounds.
type SweepPoint struct {
	Size        int64   `json:"size"`
	P50US       float64 `json:"p50_us"`
	FloorUS     float64 `json:"floor_us"`
	MBPerS      float64 `json:"mb_per_s"`
	FloorMBPerS float64 `json:"floor_mb_per_s"`
	XFloor      float64 `json:"x_floor"`
}

// round is one round's values: device -> key -> unit -> value.
type round map[string]map[string]map[string]float64

func (r round) get(t term) (float64, bool) {
	v, ok := r[t.Device][t.Key][t.Unit]
	return v, ok
}

func main() {
	out := flag.String("out", "", "directory for result.json, table.md and sweep.png (made if missing)")
	commit := flag.String("commit", "", "the tensorfs commit measured")
	quick := flag.Bool("quick", false, "a --quick run")
	gpu := flag.Bool("gpu", false, "the GPU rows ran (a GPU host): their results are required")
	var skipped multiFlag
	flag.Var(&skipped, "skipped", "what did not run and why (repeatable)")
	var without multiFlag
	flag.Var(&without, "without", "leave out the rows whose id starts with this (repeatable; say why with -skipped)")
	strict := flag.Bool("strict", false, "exit 2 when a goal is missed")
	compareMode := flag.Bool("compare", false, "print one table of ratios across the result directories given as arguments")
	flag.Parse()
	if *compareMode {
		var results []Result
		for _, dir := range flag.Args() {
			res, err := readResult(dir)
			if err != nil {
				fmt.Fprintln(os.Stderr, "benchreport:", err)
				os.Exit(1)
			}
			results = append(results, res)
		}
		if len(results) == 0 {
			fmt.Fprintln(os.Stderr, "usage: benchreport -compare RESULT-DIR...")
			os.Exit(64)
		}
		compare(os.Stdout, results)
		return
	}
	if *out == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: benchreport -out DIR [-commit C] [-quick] [-gpu] [-without ID-PREFIX] [-skipped REASON] [-strict] ROUND...")
		os.Exit(64)
	}
	var rounds []round
	for _, p := range flag.Args() {
		r, err := readRound(p)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchreport:", err)
			os.Exit(1)
		}
		rounds = append(rounds, r)
	}
	res := report(rounds, *gpu, without...)
	res.Date = time.Now().UTC().Format(time.RFC3339)
	res.Commit, res.Quick, res.Skipped = *commit, *quick, skipped
	res.Machine = machine()
	status, err := write(*out, res, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
	if status == 2 && !*strict {
		status = 0
	}
	os.Exit(status)
}

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, "; ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// procsSuffix is the "-GOMAXPROCS" end of a benchmark name.
var procsSuffix = regexp.MustCompile(`-[0-9]+$`)

// readRound reads one round's raw output. A benchmark that appears twice
// keeps its last line. Errors: the file's; none for lines that are not
// benchmarks (logs, PASS).
func readRound(path string) (round, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseRound(f, path)
}

func parseRound(r io.Reader, name string) (round, error) {
	rd := benchfmt.NewReader(r, name)
	out := round{}
	for rd.Scan() {
		res, ok := rd.Result().(*benchfmt.Result)
		if !ok {
			continue // a syntax error is a line that is not a benchmark's
		}
		dev := res.GetConfig("tensorfs-device")
		if dev == "" {
			dev = "host"
		}
		key := strings.TrimPrefix(procsSuffix.ReplaceAllString(res.Name.String(), ""), "Benchmark")
		if out[dev] == nil {
			out[dev] = map[string]map[string]float64{}
		}
		vals := map[string]float64{}
		for _, v := range res.Values {
			unit, x := v.Unit, v.Value
			if v.OrigUnit != "" {
				unit, x = v.OrigUnit, v.OrigValue
			}
			if math.IsNaN(x) || math.IsInf(x, 0) {
				return nil, fmt.Errorf("%s: %s: %s is %v: not a figure", name, res.Name, unit, x)
			}
			vals[unit] = x
		}
		out[dev][key] = vals
	}
	if err := rd.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no benchmark results", name)
	}
	return out, nil
}

// report computes the rows and the sweep from the rounds: the GPU rows
// only with gpu, no row whose ID starts with one of without.
func report(rounds []round, gpu bool, without ...string) Result {
	res := Result{Schema: 1, Rounds: len(rounds)}
	for _, s := range rows {
		if s.GPU && !gpu || slices.ContainsFunc(without, func(p string) bool { return strings.HasPrefix(s.ID, p) }) {
			continue
		}
		res.Rows = append(res.Rows, computeRow(s, rounds))
	}
	res.Sweep = sweep(rounds)
	return res
}

// computeRow is one row over the rounds; a round without the row's value
// or a floor term makes the row "missing".
func computeRow(s rowSpec, rounds []round) Row {
	row := Row{ID: s.ID, Group: s.Group, What: s.What, Unit: s.Unit, Better: string(s.Better), FloorWhat: s.FloorWhat, Goal: s.Goal}
	var vals, floors, ratios []float64
	for _, r := range rounds {
		v, ok := r.get(s.Value)
		if !ok {
			row.Met = "missing"
			return row
		}
		if v <= 0 {
			// Times and rates are positive: anything else is a broken
			// benchmark, not a figure to judge (a 0 would "meet" any ≤ goal).
			row.Met = "missing"
			return row
		}
		v /= s.Scale
		vals = append(vals, v)
		if len(s.Floor) == 0 {
			continue
		}
		var f float64
		for _, t := range s.Floor {
			x, ok := r.get(t)
			if !ok {
				row.Met = "missing"
				return row
			}
			f += x
		}
		if f <= 0 {
			row.Met = "missing"
			return row
		}
		f /= s.Scale
		floors = append(floors, f)
		if s.Better == faster {
			ratios = append(ratios, f/v)
		} else {
			ratios = append(ratios, v/f)
		}
	}
	if len(vals) == 0 {
		row.Met = "missing"
		return row
	}
	row.Value = stat(vals)
	judged := row.Value.Median
	if floors != nil {
		row.Floor, row.Ratio = stat(floors), stat(ratios)
		judged = row.Ratio.Median
	}
	if s.Goal != 0 {
		met := judged >= s.Goal
		if s.Better == lower {
			met = judged <= s.Goal
		}
		row.Met = map[bool]string{true: "yes", false: "no"}[met]
	}
	return row
}

func stat(xs []float64) *Stat {
	s := slices.Clone(xs)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return &Stat{Median: m, Min: s[0], Max: s[len(s)-1], Rounds: xs}
}

// sweep is the sweep's points by path: host results of
// InPlaceSweep/PATH/SIZE present in every round, medians over them.
func sweep(rounds []round) map[string][]SweepPoint {
	out := map[string][]SweepPoint{}
	if len(rounds) == 0 {
		return out
	}
	for key := range rounds[0]["host"] {
		parts := strings.Split(key, "/")
		if len(parts) != 3 || parts[0] != sweepBench {
			continue
		}
		size, err := parseSize(parts[2])
		if err != nil {
			continue
		}
		med := func(unit string) (float64, bool) {
			var xs []float64
			for _, r := range rounds {
				v, ok := r.get(h(key, unit))
				if !ok {
					return 0, false
				}
				xs = append(xs, v)
			}
			return stat(xs).Median, true
		}
		p := SweepPoint{Size: size}
		ok := true
		for _, f := range []struct {
			unit string
			dst  *float64
		}{{"p50-us", &p.P50US}, {"floor-us", &p.FloorUS}, {"MB/s", &p.MBPerS}, {"floor-MB/s", &p.FloorMBPerS}, {"x-floor", &p.XFloor}} {
			v, k := med(f.unit)
			ok = ok && k
			*f.dst = v
		}
		if ok {
			out[parts[1]] = append(out[parts[1]], p)
		}
	}
	for _, pts := range out {
		slices.SortFunc(pts, func(a, b SweepPoint) int { return int(a.Size - b.Size) })
	}
	return out
}

// parseSize reads a sweep point's name (4K, 16M, 1G, or bytes).
func parseSize(s string) (int64, error) {
	mul := int64(1)
	switch {
	case strings.HasSuffix(s, "K"):
		mul, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mul, s = 1<<20, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "G"):
		mul, s = 1<<30, strings.TrimSuffix(s, "G")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n * mul, err
}

// write writes result.json, table.md and sweep.png into dir and the table
// to w; status 1 when a row is missing, 2 when a goal is missed, else 0.
//
// Each file is written beside its name and renamed into place, the plot
// first: a report that fails leaves no file of its own beside an older
// run's, and none half-written.
func write(dir string, res Result, w io.Writer) (status int, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 1, err
	}
	js, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return 1, err
	}
	var tb bytes.Buffer
	status = table(&tb, res)
	png := filepath.Join(dir, ".sweep.png.tmp")
	defer os.Remove(png)
	if err := plotSweep(png, res); err != nil {
		return 1, fmt.Errorf("sweep.png: %w", err)
	}
	files := []struct {
		name string
		data []byte
	}{{"result.json", append(js, '\n')}, {"table.md", tb.Bytes()}}
	for _, f := range files {
		tmp := filepath.Join(dir, "."+f.name+".tmp")
		if err := os.WriteFile(tmp, f.data, 0o644); err != nil {
			os.Remove(tmp)
			return 1, err
		}
		defer os.Remove(tmp)
	}
	for _, name := range []string{"sweep.png", "result.json", "table.md"} {
		if err := os.Rename(filepath.Join(dir, "."+name+".tmp"), filepath.Join(dir, name)); err != nil {
			return 1, err
		}
	}
	w.Write(tb.Bytes())
	return status, nil
}

// table writes the markdown table; its status as write's.
func table(w io.Writer, res Result) (status int) {
	m := res.Machine
	fmt.Fprintf(w, "tensorfs %s, %s: %d CPUs (%s), %.0f GiB, kernel %s", res.Commit, m.Hostname, m.CPUs, m.CPUModel, m.MemoryGiB, m.Kernel)
	if m.GPU != "" {
		fmt.Fprintf(w, ", %s (driver %s)", m.GPU, m.Driver)
	}
	kind := "rounds"
	if res.Quick {
		kind = "round(s) of --quick: a smoke test, not figures to quote"
	}
	fmt.Fprintf(w, ", %s; %d %s; %s\n\n", m.Go, res.Rounds, kind, res.Date)
	group := ""
	for _, r := range res.Rows {
		if r.Group != group {
			group = r.Group
			fmt.Fprintf(w, "\n**%s**\n\n", group)
			fmt.Fprintln(w, "| benchmark | tensorfs, median (min–max) | floor, median (min–max) | ratio, median (min–max) | goal | met |")
			fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- |")
		}
		if r.Met == "missing" {
			status = 1
		}
		if r.Met == "no" && status == 0 {
			status = 2
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", r.What, statCell(r.Value, r.Unit), floorCell(r), ratioCell(r.Ratio), goalCell(r), metCell(r.Met))
	}
	if len(res.Sweep) > 0 {
		fmt.Fprintf(w, "\n**In-place sweep, host memory (sweep.png): p50, and the floor of the same run (setxattr + request/reply + memmove on IPC; setxattr + raw TCP on TCP)**\n\n")
		fmt.Fprintln(w, "| path | size | tensorfs p50 | floor | tensorfs MB/s | floor MB/s | floor/tensorfs |")
		fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- |")
		for _, path := range slices.Sorted(mapKeys(res.Sweep)) {
			for _, p := range res.Sweep[path] {
				fmt.Fprintf(w, "| %s | %s | %s µs | %s µs | %s | %s | %.2f |\n", path, sizeText(p.Size), num(p.P50US), num(p.FloorUS), num(p.MBPerS), num(p.FloorMBPerS), p.XFloor)
			}
		}
	}
	for _, s := range res.Skipped {
		fmt.Fprintf(w, "\nSkipped: %s\n", s)
	}
	fmt.Fprintln(w, "\nRatios are per round, tensorfs ÷ floor (floor ÷ tensorfs for times read as throughput, goal ≥); \"met\" judges the median ratio.")
	return status
}

// readResult reads DIR/result.json. Errors: the file's, or its JSON's.
func readResult(dir string) (Result, error) {
	var res Result
	b, err := os.ReadFile(filepath.Join(dir, "result.json"))
	if err != nil {
		return res, err
	}
	if err := json.Unmarshal(b, &res); err != nil {
		return res, fmt.Errorf("%s: %w", filepath.Join(dir, "result.json"), err)
	}
	if res.Schema != 1 {
		return res, fmt.Errorf("%s: schema %d, not 1 (this benchreport's)", filepath.Join(dir, "result.json"), res.Schema)
	}
	return res, nil
}

// compare writes one table of the rows that have a ratio or a goal across
// results, in the order of the first result that has each row.
func compare(w io.Writer, results []Result) {
	var ids []string
	byID := make([]map[string]Row, len(results))
	spec := map[string]Row{}
	for i, res := range results {
		byID[i] = map[string]Row{}
		for _, r := range res.Rows {
			if r.Ratio == nil && r.Goal == 0 {
				continue
			}
			byID[i][r.ID] = r
			if _, ok := spec[r.ID]; !ok {
				spec[r.ID] = r
				ids = append(ids, r.ID)
			}
		}
	}
	fmt.Fprint(w, "| benchmark | floor | goal |")
	for _, res := range results {
		m := res.Machine
		where := fmt.Sprintf("%d CPUs", m.CPUs)
		if m.GPU != "" {
			where += ", " + m.GPU
		}
		fmt.Fprintf(w, " %s (%s), %s |", where, res.Commit, res.Date[:min(10, len(res.Date))])
	}
	fmt.Fprint(w, "\n| --- | --- | --- |")
	for range results {
		fmt.Fprint(w, " --- |")
	}
	fmt.Fprintln(w)
	for _, id := range ids {
		s := spec[id]
		floor := s.FloorWhat
		if floor == "" {
			floor = "—"
		}
		fmt.Fprintf(w, "| %s | %s | %s |", s.What, floor, goalCell(s))
		for i := range results {
			r, ok := byID[i][id]
			switch {
			case !ok:
				fmt.Fprint(w, " not run |")
			case r.Met == "missing" || r.Value == nil:
				fmt.Fprint(w, " missing |")
			case r.Ratio == nil:
				fmt.Fprintf(w, " %s %s: %s |", num(r.Value.Median), r.Unit, metCell(r.Met))
			case r.Met == "":
				fmt.Fprintf(w, " %.2f |", r.Ratio.Median)
			default:
				fmt.Fprintf(w, " %.2f: %s |", r.Ratio.Median, metCell(r.Met))
			}
		}
		fmt.Fprintln(w)
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func statCell(s *Stat, unit string) string {
	if s == nil {
		return "missing"
	}
	return fmt.Sprintf("%s %s (%s–%s)", num(s.Median), unit, num(s.Min), num(s.Max))
}

func floorCell(r Row) string {
	if r.Floor == nil {
		if r.FloorWhat != "" {
			return r.FloorWhat
		}
		return "—"
	}
	return statCell(r.Floor, r.Unit) + ": " + r.FloorWhat
}

func ratioCell(s *Stat) string {
	if s == nil {
		return "—"
	}
	return fmt.Sprintf("%.2f (%.2f–%.2f)", s.Median, s.Min, s.Max)
}

func goalCell(r Row) string {
	if r.Goal == 0 {
		return "—"
	}
	op := "≥"
	if r.Better == string(lower) {
		op = "≤"
	}
	if r.Floor == nil && r.Ratio == nil && r.Met != "missing" {
		return fmt.Sprintf("%s %g %s", op, r.Goal, r.Unit)
	}
	return fmt.Sprintf("%s %g", op, r.Goal)
}

func metCell(m string) string {
	switch m {
	case "no":
		return "**no**"
	case "":
		return "—"
	}
	return m
}

// num formats a figure with three significant digits or its integer part.
func num(x float64) string {
	switch {
	case x >= 1000:
		return strconv.FormatFloat(x, 'f', 0, 64)
	case x >= 100:
		return strconv.FormatFloat(x, 'f', 1, 64)
	case x >= 1:
		return strconv.FormatFloat(x, 'f', 2, 64)
	}
	return strconv.FormatFloat(x, 'g', 3, 64)
}

func sizeText(n int64) string {
	for _, u := range []struct {
		s string
		n int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.n && n%u.n == 0 {
			return fmt.Sprintf("%d %s", n/u.n, u.s)
		}
	}
	return fmt.Sprintf("%d B", n)
}

// plotSweep draws the sweep: per path, tensorfs and its floor (dashed).
func plotSweep(path string, res Result) error {
	var ss []benchplot.Series
	for _, p := range slices.Sorted(mapKeys(res.Sweep)) {
		var t, f []benchplot.Point
		for _, x := range res.Sweep[p] {
			t = append(t, benchplot.Point{Size: x.Size, GBPerS: x.MBPerS / 1e3, LatencyUS: x.P50US})
			f = append(f, benchplot.Point{Size: x.Size, GBPerS: x.FloorMBPerS / 1e3, LatencyUS: x.FloorUS})
		}
		ss = append(ss, benchplot.Series{Name: p + " path, tensorfs", Points: t}, benchplot.Series{Name: p + " path, floor", Points: f, Floor: true})
	}
	if len(ss) == 0 {
		return errors.New("no sweep results (BenchmarkInPlaceSweep) to draw")
	}
	title := fmt.Sprintf("in-place copy_to between two daemons, host memory: tensorfs %s, %s, %d CPUs", res.Commit, res.Machine.Hostname, res.Machine.CPUs)
	return benchplot.Write(path, title, "bytes per copy", "p50 latency per copy", ss)
}

// machine describes this host.
func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version()}
	m.Hostname, _ = os.Hostname()
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		m.MemoryGiB = float64(si.Totalram) * float64(si.Unit) / (1 << 30)
	}
	if out, err := exec.Command("nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader").Output(); err == nil {
		first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		name, drv, _ := strings.Cut(first, ",")
		m.GPU, m.Driver = strings.TrimSpace(name), strings.TrimSpace(drv)
	}
	return m
}
