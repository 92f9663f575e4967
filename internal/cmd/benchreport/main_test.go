package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A round as go test prints it, with a GPU section and log noise.
const round1 = `goos: linux
cpu: AMD EPYC
BenchmarkInPlace4K/ipc-2   	1	 99 ns/op	 100.0 p50-us	 50.00 floor-us	 2.000 x-floor
BenchmarkInPlace4K/tcp-2   	1	 99 ns/op	 120.0 p50-us	 40.00 floor-us
    harness_test.go:12: a log line: with a colon
BenchmarkInPlaceScatter1000x8K/tcp-2  1  99 ns/op  2000 p50-us  1000 raw-p50-us
BenchmarkInPlaceSweep/ipc/4K-2  1  99 ns/op  50 p50-us  25 floor-us  80 MB/s  160 floor-MB/s  0.5 x-floor
BenchmarkInPlaceSweep/ipc/1M-2  1  99 ns/op  500 p50-us  250 floor-us  2000 MB/s  4000 floor-MB/s  0.5 x-floor
BenchmarkInPlaceSweep/tcp/1M-2  1  99 ns/op  800 p50-us  400 floor-us  1300 MB/s  2600 floor-MB/s  0.5 x-floor
tensorfs-device: cuda:0
BenchmarkInPlace4K/ipc-2   	1	 99 ns/op	 90.0 p50-us	 30.0 setxattr-us	 10.0 reqreply-us
BenchmarkGPUFloor 1 99 ns/op 20.0 copy4k-us 13 scatter-us 514 ipc1g-us
PASS
`

// The rows of two rounds: values and floors read per device, ratios per
// round, floors summed from several lines, goals judged on the median.
func TestReport(t *testing.T) {
	r1, err := parseRound(strings.NewReader(round1), "r1")
	require.NoError(t, err)
	r2, err := parseRound(strings.NewReader(strings.ReplaceAll(round1, "100.0 p50-us", "140.0 p50-us")), "r2")
	require.NoError(t, err)
	v, ok := r1.get(h("InPlace4K/ipc", "p50-us"))
	require.True(t, ok)
	require.Equal(t, 100.0, v, "host's line, not cuda:0's of the same name")
	v, _ = r1.get(g("InPlace4K/ipc", "p50-us"))
	require.Equal(t, 90.0, v)

	res := report([]round{r1, r2}, true)
	byID := map[string]Row{}
	for _, r := range res.Rows {
		byID[r.ID] = r
	}
	ipc := byID["inplace-4k-ipc"]
	require.Equal(t, []float64{2, 2.8}, ipc.Ratio.Rounds, "per-round ratios")
	require.InDelta(t, 2.4, ipc.Ratio.Median, 1e-9)
	require.Equal(t, "no", ipc.Met, "2.4 > 2")
	require.Equal(t, 120.0, ipc.Value.Median)
	require.Equal(t, 100.0, ipc.Value.Min)
	require.Equal(t, "no", byID["inplace-4k-tcp"].Met, "3 > 2.5")
	sc := byID["inplace-scatter-tcp"]
	require.InDelta(t, 0.5, sc.Ratio.Median, 1e-9, "a time read as throughput: floor/tensorfs")
	require.Equal(t, "no", sc.Met)
	gi := byID["gpu-inplace-4k-ipc"]
	require.InDelta(t, 60.0, gi.Floor.Median, 1e-9, "setxattr + reqreply of cuda:0's line + the GPU copy")
	require.InDelta(t, 1.5, gi.Ratio.Median, 1e-9)
	require.Equal(t, "yes", gi.Met)
	require.Equal(t, "missing", byID["fuse-seq-read"].Met, "not run")
	require.Equal(t, "missing", byID["gpu-inplace-4k-tcp"].Met, "a GPU row without its result")

	require.Len(t, res.Sweep["ipc"], 2)
	require.Equal(t, int64(4096), res.Sweep["ipc"][0].Size, "ascending sizes")
	require.Equal(t, int64(1<<20), res.Sweep["ipc"][1].Size)
	require.Equal(t, 2000.0, res.Sweep["ipc"][1].MBPerS)

	for _, r := range report([]round{r1}, false, "etcd-", "fuse-").Rows {
		require.NotContains(t, r.ID, "gpu-", "GPU rows only where they ran")
		require.NotContains(t, r.ID, "etcd-", "-without")
		require.NotContains(t, r.ID, "fuse-", "-without")
	}

	dir := t.TempDir()
	var out bytes.Buffer
	res.Commit, res.Machine = "abc123", machine()
	status, err := write(dir, res, &out)
	require.NoError(t, err)
	require.Equal(t, 1, status, "rows are missing")
	require.Contains(t, out.String(), "| 4 KiB copy_to into a range, IPC path, p50 | 120.0 µs (100.0–140.0) | 50.00 µs (50.00–50.00): setxattr + request/reply + 4 KiB memmove | 2.40 (2.00–2.80) | ≤ 2 | **no** |")
	js, err := os.ReadFile(filepath.Join(dir, "result.json"))
	require.NoError(t, err)
	var back Result
	require.NoError(t, json.Unmarshal(js, &back))
	require.Equal(t, "abc123", back.Commit)
	require.Equal(t, len(res.Rows), len(back.Rows))
	png, err := os.ReadFile(filepath.Join(dir, "sweep.png"))
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(png, []byte("\x89PNG")))
	md, err := os.ReadFile(filepath.Join(dir, "table.md"))
	require.NoError(t, err)
	require.Equal(t, out.String(), string(md))
}

// Status: 0 when every goal is met, 2 when one is missed, 1 when a row
// has no result.
func TestStatus(t *testing.T) {
	res := Result{Rows: []Row{{What: "a", Met: "yes"}, {What: "b", Met: ""}}}
	require.Zero(t, table(&bytes.Buffer{}, res))
	res.Rows = append(res.Rows, Row{What: "c", Met: "no"})
	require.Equal(t, 2, table(&bytes.Buffer{}, res))
	res.Rows = append(res.Rows, Row{What: "d", Met: "missing"})
	require.Equal(t, 1, table(&bytes.Buffer{}, res))
}

func TestParseSize(t *testing.T) {
	for s, n := range map[string]int64{"4K": 4096, "16M": 16 << 20, "1G": 1 << 30, "100": 100} {
		got, err := parseSize(s)
		require.NoError(t, err)
		require.Equal(t, n, got, s)
	}
	_, err := parseSize("x")
	require.Error(t, err)
}

// Compare: one line per row with a ratio or goal, a column per result,
// rows a result lacks marked, written results read back.
func TestCompare(t *testing.T) {
	r1, err := parseRound(strings.NewReader(round1), "r1")
	require.NoError(t, err)
	host := report([]round{r1}, false)
	host.Commit, host.Date, host.Machine = "aaa", "2026-12-03T00:00:00Z", Machine{CPUs: 2}
	gpu := report([]round{r1}, true)
	gpu.Commit, gpu.Date, gpu.Machine = "bbb", "2026-12-04T00:00:00Z", Machine{CPUs: 16, GPU: "NVIDIA H200"}
	var dirs []string
	for _, res := range []Result{host, gpu} {
		dir := t.TempDir()
		_, err := write(dir, res, io.Discard)
		require.NoError(t, err)
		dirs = append(dirs, dir)
	}
	var results []Result
	for _, d := range dirs {
		res, err := readResult(d)
		require.NoError(t, err)
		results = append(results, res)
	}
	var out bytes.Buffer
	compare(&out, results)
	s := out.String()
	require.Contains(t, s, "| benchmark | floor | goal | 2 CPUs (aaa), 2026-12-03 | 16 CPUs, NVIDIA H200 (bbb), 2026-12-04 |")
	require.Contains(t, s, "| 4 KiB copy_to into a range, IPC path, p50 | setxattr + request/reply + 4 KiB memmove | ≤ 2 | 2.00: yes | 2.00: yes |")
	require.Contains(t, s, "| 4 KiB copy_to into a range, IPC path, cuda:0 → cuda:0, p50 | setxattr + request/reply + 4 KiB device copy and sync | ≤ 2 | not run | 1.50: yes |")
	require.Contains(t, s, "| sequential read, 256 MiB | the same on the FUSE floor | ≥ 0.9 | missing | missing |")
	_, err = readResult(t.TempDir())
	require.Error(t, err, "no result.json")
}

// Bad figures and bad results: a NaN or Inf figure and a round without a
// benchmark are errors naming the file; a figure of 0 or less makes its
// row missing instead of "meeting" a goal; -compare refuses another
// schema and survives a short date; a report that cannot draw its sweep
// writes nothing beside an older run's files.
func TestBadFigures(t *testing.T) {
	for _, bad := range []string{"NaN", "+Inf", "-Inf"} {
		_, err := parseRound(strings.NewReader("BenchmarkInPlace4K/ipc-2 1 99 ns/op "+bad+" p50-us\n"), "r.txt")
		require.ErrorContains(t, err, "r.txt", bad)
		require.ErrorContains(t, err, "p50-us", bad)
	}
	_, err := parseRound(strings.NewReader("PASS\nok\n"), "empty.txt")
	require.ErrorContains(t, err, "empty.txt: no benchmark results")

	for _, line := range []string{
		"BenchmarkInPlace4K/ipc-2 1 99 ns/op 0 p50-us 50 floor-us",
		"BenchmarkInPlace4K/ipc-2 1 99 ns/op 100 p50-us -5 floor-us",
	} {
		r, err := parseRound(strings.NewReader(line+"\n"), "r")
		require.NoError(t, err)
		for _, row := range report([]round{r}, false).Rows {
			if row.ID == "inplace-4k-ipc" {
				require.Equal(t, "missing", row.Met, "%s", line)
			}
		}
	}

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "result.json"), []byte(`{"date":"2026"}`), 0o644))
	_, err = readResult(dir)
	require.ErrorContains(t, err, "schema 0")
	var out bytes.Buffer
	require.NotPanics(t, func() { compare(&out, []Result{{Schema: 1, Date: "2026"}}) })

	old := t.TempDir()
	for _, f := range []string{"result.json", "table.md", "sweep.png"} {
		require.NoError(t, os.WriteFile(filepath.Join(old, f), []byte("old"), 0o644))
	}
	r, err := parseRound(strings.NewReader("BenchmarkInPlace4K/ipc-2 1 99 ns/op 100 p50-us 50 floor-us\n"), "r")
	require.NoError(t, err)
	_, err = write(old, report([]round{r}, false), io.Discard)
	require.ErrorContains(t, err, "no sweep results")
	ents, err := os.ReadDir(old)
	require.NoError(t, err)
	require.Len(t, ents, 3, "no temporary left")
	for _, f := range []string{"result.json", "table.md", "sweep.png"} {
		b, err := os.ReadFile(filepath.Join(old, f))
		require.NoError(t, err)
		require.Equal(t, "old", string(b), "%s untouched", f)
	}
}
