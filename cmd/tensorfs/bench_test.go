package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// --sizes: humanize's parser, with a bare K/M/G/T binary as truncate and
// dd have it; ascending, without duplicates; bad, zero and huge sizes are
// refused naming the value.
func TestParseBenchSizes(t *testing.T) {
	got, err := parseBenchSizes([]string{"4K", "64K", "1M", "16M", "256M", "1G"})
	require.NoError(t, err)
	require.Equal(t, []int64{4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30}, got)
	got, err = parseBenchSizes([]string{"1G", "4KiB", "4KB", "4k", "1000", " 2 M", "1.5K", "4096", "1T"})
	require.NoError(t, err)
	require.Equal(t, []int64{1000, 1536, 4000, 4096, 2 << 20, 1 << 30, 1 << 40}, got, "sorted, 4K = 4KiB = 4096 once")
	for _, tc := range []struct{ in, want string }{
		{"4Q", `--sizes "4Q": not a byte size`},
		{"", `--sizes "": not a byte size`},
		{"K", `--sizes "K": not a byte size`},
		{"-1", `--sizes "-1": not a byte size`},
		{"0", `--sizes "0": a copy needs at least 1 byte`},
		{"9P", `--sizes "9P": past the largest tensor (2^53 bytes)`},
	} {
		_, err := parseBenchSizes([]string{"4K", tc.in})
		require.ErrorContains(t, err, tc.want, "%q", tc.in)
	}
	_, err = parseBenchSizes(nil)
	require.ErrorContains(t, err, "no sizes")
}

// --modes and --dirs: known values, each once, in the order given.
func TestParseChoices(t *testing.T) {
	got, err := parseChoices("--modes", []string{"whole", "INPLACE", "whole"}, modeInPlace, modeWhole)
	require.NoError(t, err)
	require.Equal(t, []string{modeWhole, modeInPlace}, got)
	_, err = parseChoices("--dirs", []string{"push", "sideways"}, dirPush, dirPull)
	require.EqualError(t, err, `--dirs "sideways": want push, pull`)
	_, err = parseChoices("--dirs", nil, dirPush, dirPull)
	require.EqualError(t, err, "--dirs: none given; want push, pull")
}

// Each flag's bad value is refused with the flag's name and what it takes.
func TestBenchOptions(t *testing.T) {
	ok := func(o benchOptions) (benchOptions, error) {
		return o.with([]string{"4K"}, []string{"inplace"}, []string{"push"}, 1, 0, time.Second)
	}
	o, err := ok(benchOptions{check: 2})
	require.NoError(t, err)
	require.Equal(t, []int64{4096}, o.sizes)
	require.Equal(t, time.Second, o.dur)
	for _, tc := range []struct {
		o            benchOptions
		sizes        []string
		batch, iters int
		dur          time.Duration
		want         string
	}{
		{batch: 0, iters: 0, dur: time.Second, want: "--batch 0: at least 1 descriptor per call"},
		{batch: 1, iters: -1, dur: time.Second, want: "--iters -1: want at least 1 call per point"},
		{batch: 1, dur: 0, want: "--time 0s: must be positive"},
		{o: benchOptions{check: -1}, batch: 1, dur: time.Second, want: "--check -1"},
		{o: benchOptions{plot: "out.svg"}, batch: 1, dur: time.Second, want: "--plot out.svg: want a .png file"},
		{o: benchOptions{plot: "dir.png/out"}, batch: 1, dur: time.Second, want: "want a .png file"},
		{o: benchOptions{peer: "a:b"}, batch: 1, dur: time.Second, want: `--peer "a:b": not a node name`},
		{sizes: []string{"1G"}, batch: 1 << 24, dur: time.Second, want: "--sizes 1.0 GiB x --batch 16777216: past the largest tensor"},
	} {
		sizes := tc.sizes
		if sizes == nil {
			sizes = []string{"4K"}
		}
		_, err := tc.o.with(sizes, []string{"inplace"}, []string{"push"}, tc.batch, tc.iters, tc.dur)
		require.ErrorContains(t, err, tc.want)
	}
	o, err = (benchOptions{plot: "/tmp/x.PNG"}).with([]string{"4K"}, []string{"whole"}, []string{"pull"}, 3, 5, 0)
	require.NoError(t, err, "--iters needs no --time")
	require.Equal(t, 5, o.iters)
	require.Equal(t, 3, o.batch)
}

// The command line: flags before or after MOUNT; --iters with --time, a
// bad flag value and a path off tensorfs are one line and exit 1; no
// MOUNT is a usage error (exit 2).
func TestBenchCommandLine(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		code int
		line string
	}{
		{[]string{"bench"}, 2, "tensorfs: bench: missing MOUNT"},
		{[]string{"bench", "--iters", "3", dir, "--time", "1s"}, 1, "tensorfs: bench: --iters and --time both given"},
		{[]string{"bench", dir, "--sizes", "4K,1X"}, 1, `tensorfs: bench: --sizes "1X": not a byte size`},
		{[]string{"bench", "--batch", "0", dir}, 1, "tensorfs: bench: --batch 0"},
		{[]string{"bench", dir, "--modes", "inplace,copy"}, 1, `tensorfs: bench: --modes "copy": want inplace, whole`},
		{[]string{"bench", "--sizes", "4K", dir, "--iters", "2"}, 1, "tensorfs: bench " + dir + ": not on a tensorfs mount"},
		{[]string{"bench", filepath.Join(dir, "none"), "--peer", "b"}, 1, "tensorfs: bench " + filepath.Join(dir, "none") + ": No such file or directory"},
	} {
		var out bytes.Buffer
		root := newRootCmd()
		root.SetArgs(tc.args)
		root.SetOut(&out)
		require.Equal(t, tc.code, run(root, &out), "%v: %s", tc.args, out.String())
		first, _, _ := strings.Cut(out.String(), "\n")
		require.True(t, strings.HasPrefix(first, tc.line), "%v: %q", tc.args, out.String())
		if tc.code == 1 {
			require.Equal(t, 1, strings.Count(out.String(), "\n"), "one line: %q", out.String())
		}
	}
	var out bytes.Buffer
	root := newRootCmd()
	root.SetArgs([]string{"bench", "--help"})
	root.SetOut(&out)
	require.Equal(t, 0, run(root, &out))
	for _, flag := range []string{"--peer", "--sizes", "--batch", "--modes", "--dirs", "--iters", "--time", "--json", "--plot", "--check", "--leave-peer-dir"} {
		require.Contains(t, out.String(), flag)
	}
}

// Percentiles are by nearest rank; GB/s is bytes over time in calls.
func TestSummarize(t *testing.T) {
	ms := time.Millisecond
	var lat []time.Duration
	for i := 100; i >= 1; i-- {
		lat = append(lat, time.Duration(i)*ms)
	}
	r := summarize(benchPhase{mode: modeInPlace, size: 1 << 20, n: 4}, dirPull, lat, 2)
	require.Equal(t, 50_000.0, r.P50US)
	require.Equal(t, 99_000.0, r.P99US)
	require.Equal(t, 50_500.0, r.MeanUS)
	require.Equal(t, int64(4<<20), r.BytesPerCall)
	require.Equal(t, 100, r.Calls)
	require.Equal(t, 2, r.WritesPerCall)
	require.InDelta(t, float64(100*4<<20)/5.05/1e9, r.GBPerS, 1e-12)
	require.Equal(t, []time.Duration{100 * ms, 99 * ms}, lat[:2], "the caller's slice is not sorted")

	one := summarize(benchPhase{mode: modeWhole, size: 4096, n: 1}, dirPush, []time.Duration{3 * ms}, 1)
	require.Equal(t, 3000.0, one.P50US)
	require.Equal(t, 3000.0, one.P99US)
	ten := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	require.Equal(t, time.Duration(10), percentile(ten, 99), "p99 of 10 calls is the slowest")
	require.Equal(t, time.Duration(5), percentile(ten, 50))
	require.Equal(t, time.Duration(1), percentile(ten, 0))
}

// A value over 64 KiB is split at line boundaries, in order.
func TestSplitValue(t *testing.T) {
	var lines []string
	for i := range 3000 {
		lines = append(lines, strings.Repeat("x", 40)+strings.Repeat("y", i%7))
	}
	vals := splitValue(lines)
	require.Greater(t, len(vals), 1)
	var back []string
	for _, v := range vals {
		require.LessOrEqual(t, len(v), xattrValueMax)
		back = append(back, strings.Split(v, "\n")...)
	}
	require.Equal(t, lines, back)
	require.Equal(t, []string{"a\nb"}, splitValue([]string{"a", "b"}))
	require.Nil(t, splitValue(nil))
}

// The lines of each kind of call, with a peer and inside the mount.
func TestBenchCalls(t *testing.T) {
	b := &bench{mnt: "/mnt/a", local: "/mnt/a/tensorfs-bench-1", rel: "/tensorfs-bench-1", opt: benchOptions{peer: "b"}}
	ph := benchPhase{mode: modeInPlace, size: 4096, n: 2}
	require.Equal(t, benchCall{target: "/mnt/a/tensorfs-bench-1/a", attr: "user.tensorfs.copy_to",
		values: []string{"@0+4096 b:/tensorfs-bench-1/b@0\n@4096+4096 b:/tensorfs-bench-1/b@4096"}}, b.inPlacePush(ph))
	require.Equal(t, benchCall{target: "/mnt/a/tensorfs-bench-1/a", attr: "user.tensorfs.copy_from",
		values: []string{"b:/tensorfs-bench-1/b@0+4096 @0\nb:/tensorfs-bench-1/b@4096+4096 @4096"}}, b.inPlacePull(ph))
	ph.mode = modeWhole
	require.Equal(t, benchCall{target: "/mnt/a/tensorfs-bench-1/w", attr: "user.tensorfs.copy_to",
		values: []string{"b:/tensorfs-bench-1/w.0\nb:/tensorfs-bench-1/w.1"}}, b.wholePush(ph))
	require.Equal(t, benchCall{target: "/mnt/a", attr: "user.tensorfs.batch",
		values: []string{"b:/tensorfs-bench-1/w.0 /tensorfs-bench-1/p.0\nb:/tensorfs-bench-1/w.1 /tensorfs-bench-1/p.1"}}, b.wholePull(ph))
	ph.n = 1
	require.Equal(t, benchCall{target: "/mnt/a/tensorfs-bench-1/p.0", attr: "user.tensorfs.copy_from",
		values: []string{"b:/tensorfs-bench-1/w.0"}}, b.wholePull(ph))
	b.opt.peer = ""
	require.Equal(t, []string{"@0+4096 /tensorfs-bench-1/b@0"}, b.inPlacePush(benchPhase{mode: modeInPlace, size: 4096, n: 1}).values)
	require.Equal(t, "/tensorfs-bench-1", b.remote(""))
	b.opt.peer = "b"
	require.Equal(t, "b:/tensorfs-bench-1", b.remote(""))
	// 2000 in-place lines of ~45 bytes: two setxattrs.
	require.Len(t, b.inPlacePush(benchPhase{mode: modeInPlace, size: 4096, n: 2000}).values, 2)
}

// What a phase holds at once, on each side.
func TestBenchNeeds(t *testing.T) {
	const s, n = 1 << 20, 4
	both := []string{dirPush, dirPull}
	push := []string{dirPush}
	for _, tc := range []struct {
		mode          string
		dirs          []string
		peer, check   bool
		local, remote int64
	}{
		{modeInPlace, both, true, true, n*s + s, n * s},       // a, v; b
		{modeInPlace, both, true, false, n * s, n * s},        // a; b
		{modeInPlace, both, false, true, 2 * n * s, 0},        // a, b
		{modeWhole, both, true, true, 2*s + 2*n*s, 2 * n * s}, // w, v, p.* and their replacements; w.* and theirs
		{modeWhole, push, true, false, s, 2 * n * s},
		{modeWhole, both, false, true, s + 3*n*s, 0},
		{modeWhole, push, false, true, s + 2*n*s, 0},
	} {
		l, r := benchNeeds(benchPhase{mode: tc.mode, size: s, n: n}, tc.dirs, tc.peer, tc.check)
		require.Equal(t, tc.local, l, "%+v", tc)
		require.Equal(t, tc.remote, r, "%+v", tc)
	}
	l, _ := benchNeeds(benchPhase{mode: modeInPlace, size: 1 << 30, n: 1}, both, true, true)
	require.Equal(t, int64(1<<30+scratchMax), l, "the scratch tensor is bounded")
}

// A pattern written in pieces (at their places in it) reads back whole;
// another seed differs; a difference is found at its byte.
func TestPattern(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	const n = 2*patternChunk + 13
	require.NoError(t, os.WriteFile(p, make([]byte, 100+n), 0o600))
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, writePatternAt(f, 100, patternChunk, 7, 0))
	require.NoError(t, writePatternAt(f, 100+patternChunk, n-patternChunk, 7, patternChunk))
	require.NoError(t, comparePatternAt(f, 100, n, 7, 0))
	require.NoError(t, comparePatternAt(f, 100+patternChunk, 5000, 7, patternChunk))
	require.ErrorContains(t, comparePatternAt(f, 100, n, 8, 0), "byte 0 of the range differs")

	data, err := os.ReadFile(p)
	require.NoError(t, err)
	require.Equal(t, make([]byte, 100), data[:100], "nothing before the range written")
	_, err = f.WriteAt([]byte{data[100+patternChunk+9] ^ 1}, 100+patternChunk+9)
	require.NoError(t, err)
	require.ErrorContains(t, comparePatternAt(f, 100, n, 7, 0), "byte 4194313 of the range differs")
	require.ErrorContains(t, comparePatternAt(f, 100+n, 1, 7, 0), "reading 1 bytes at", "past the end")

	fs := benchFiles{flag: os.O_RDONLY}
	g1, err := fs.get(p)
	require.NoError(t, err)
	g2, err := fs.get(p)
	require.NoError(t, err)
	require.Same(t, g1, g2, "opened once")
	_, err = fs.get(p + ".none")
	require.ErrorContains(t, err, "No such file or directory")
	require.NoError(t, fs.close())
	require.Empty(t, fs.open)

	a, c := make([]byte, 4096), make([]byte, 4096)
	fillPattern(a, 1, 0)
	fillPattern(c, 2, 0)
	for i := 0; i < len(a); i += 8 {
		require.NotEqual(t, a[i:i+8], c[i:i+8], "word %d", i/8)
	}
}

// The table has a title, a header and a row a point; the JSON document
// has the fields the help promises.
func TestBenchReportOutput(t *testing.T) {
	rep := &benchReport{Mount: "/mnt/a", Node: "a", Peer: "b", Batch: 1, Iters: 3, Results: []benchResult{
		{Mode: modeInPlace, Dir: dirPush, Size: 4096, Batch: 1, BytesPerCall: 4096, Calls: 3, WritesPerCall: 1, P50US: 52.1, P99US: 1520, MeanUS: 60, GBPerS: 0.07, Path: "tcp", Checked: 2},
		{Mode: modeWhole, Dir: dirPull, Size: 1 << 30, Batch: 1, BytesPerCall: 1 << 30, Calls: 3, WritesPerCall: 1, P50US: 2.5e6, P99US: 2.6e6, MeanUS: 2.55e6, GBPerS: 0.421, Checked: 0},
	}}
	var out bytes.Buffer
	writeBenchTable(&out, rep)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 4)
	require.Equal(t, "tensorfs bench /mnt/a (a), to and from b: 1 descriptor per call, 3 timed calls per point", lines[0])
	require.Equal(t, []string{"MODE", "DIR", "SIZE", "BATCH", "CALLS", "P50", "P99", "GB/S", "PATH", "CHECKED"}, strings.Fields(lines[1]))
	require.Equal(t, []string{"inplace", "push", "4.0", "KiB", "1", "3", "52.1", "µs", "1.52", "ms", "0.070", "tcp", "2"}, strings.Fields(lines[2]))
	require.Equal(t, []string{"whole", "pull", "1.0", "GiB", "1", "3", "2.500", "s", "2.600", "s", "0.421", "-", "0"}, strings.Fields(lines[3]))

	rep.Iters, rep.TimeS = 0, 0.5
	require.Contains(t, benchTitle(rep), "calls for 500ms per point")

	data, err := json.Marshal(rep)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(data, &doc))
	for _, k := range []string{"mount", "node", "peer", "batch", "time_s", "results"} {
		require.Contains(t, doc, k)
	}
	res := doc["results"].([]any)[0].(map[string]any)
	for _, k := range []string{"mode", "dir", "size", "batch", "bytes_per_call", "calls", "writes_per_call", "p50_us", "p99_us", "mean_us", "gb_per_s", "path", "checked"} {
		require.Contains(t, res, k)
	}
}

// --plot writes a PNG (one size too); a write that fails leaves no file.
func TestWriteBenchPlot(t *testing.T) {
	dir := t.TempDir()
	rep := &benchReport{Mount: "/mnt/a", Batch: 1, Iters: 3}
	for _, m := range []string{modeInPlace, modeWhole} {
		for _, d := range []string{dirPush, dirPull} {
			for i, s := range []int64{4 << 10, 1 << 20, 1 << 30} {
				rep.Results = append(rep.Results, benchResult{Mode: m, Dir: d, Size: s, GBPerS: float64(i) + 0.5, P50US: float64(10 * (i + 1))})
			}
		}
	}
	p := filepath.Join(dir, "bench.png")
	require.NoError(t, writeBenchPlot(p, rep))
	data, err := os.ReadFile(p)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")), "PNG signature")
	require.Greater(t, len(data), 20<<10)

	rep.Results = rep.Results[:1]
	require.NoError(t, writeBenchPlot(p, rep), "one point")

	require.Error(t, writeBenchPlot(filepath.Join(dir, "no", "such.png"), rep))
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, ents, 1, "only bench.png")
}

// The space checks: each mount's free space for its side, and the host's
// memory for the host-memory sides together.
func TestBenchCheckSpace(t *testing.T) {
	const mi = 1 << 20
	b := &bench{mnt: "/mnt/a", opt: benchOptions{peer: "b", sizes: []int64{4096, 16 * mi}, batch: 2,
		modes: []string{modeInPlace}, dirs: []string{dirPush, dirPull}, check: 1}}
	// 16 MiB x 2: a (32 MiB) and v (16 MiB) here, b (32 MiB) there.
	local := benchSpace{mnt: "/mnt/a", free: 48 * mi, host: true}
	remote := &benchSpace{mnt: "/mnt/b", free: 32 * mi, host: true}
	require.NoError(t, b.checkSpace(local, remote, 80*mi))
	require.NoError(t, b.checkSpace(local, nil, 0), "no peer mount here, no MemAvailable")

	local.free = 48*mi - 1
	require.EqualError(t, b.checkSpace(local, remote, 0),
		"bench /mnt/a: size 16 MiB x batch 2 needs 48 MiB at once on /mnt/a for its inplace copies (sources and destinations), which has 48 MiB free (statfs): give smaller --sizes or --batch")
	local.free = 48 * mi
	remote.free = 32*mi - 1
	require.ErrorContains(t, b.checkSpace(local, remote, 0), "needs 32 MiB at once on /mnt/b (b's mount) for its inplace copies")
	remote.free = 32 * mi
	require.EqualError(t, b.checkSpace(local, remote, 80*mi-1),
		"bench /mnt/a: size 16 MiB x batch 2 needs 80 MiB at once of host memory on /mnt/a and /mnt/b for its inplace copies (sources and destinations), and this host has 80 MiB available (MemAvailable, /proc/meminfo): give smaller --sizes or --batch")
	remote.host = false
	require.NoError(t, b.checkSpace(local, remote, 48*mi), "a GPU peer takes no host memory")
	b.opt.modes = []string{modeWhole}
	require.ErrorContains(t, b.checkSpace(local, remote, 0), "for its whole copies (sources, destinations and the temporaries of replacing copies)")
}

func TestMemAvailable(t *testing.T) {
	n, err := memAvailable()
	require.NoError(t, err)
	require.Greater(t, n, uint64(0))
}

func TestLatencyText(t *testing.T) {
	require.Equal(t, "0.5 µs", latencyText(0.5))
	require.Equal(t, "999.9 µs", latencyText(999.9))
	require.Equal(t, "1.00 ms", latencyText(1000))
	require.Equal(t, "1.000 s", latencyText(1e6))
}
