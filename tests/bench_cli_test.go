package tests

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/internal/testutil"
	"github.com/tensorfs/tensorfs/xattrs"
)

// benchDoc is the part of tensorfs bench --json the tests check.
type benchDoc struct {
	Mount   string  `json:"mount"`
	Node    string  `json:"node"`
	Peer    string  `json:"peer"`
	Batch   int     `json:"batch"`
	Iters   int     `json:"iters"`
	TimeS   float64 `json:"time_s"`
	Results []struct {
		Mode          string  `json:"mode"`
		Dir           string  `json:"dir"`
		Size          int64   `json:"size"`
		Batch         int     `json:"batch"`
		BytesPerCall  int64   `json:"bytes_per_call"`
		Calls         int     `json:"calls"`
		WritesPerCall int     `json:"writes_per_call"`
		P50US         float64 `json:"p50_us"`
		P99US         float64 `json:"p99_us"`
		MeanUS        float64 `json:"mean_us"`
		GBPerS        float64 `json:"gb_per_s"`
		Path          string  `json:"path"`
		Checked       int     `json:"checked"`
	} `json:"results"`
}

// benchJSON runs a bench that must succeed with --json and decodes its
// stdout strictly.
func benchJSON(t *testing.T, args ...string) benchDoc {
	t.Helper()
	out, errOut, code := cli(t, append([]string{"bench", "--json"}, args...)...)
	require.Zero(t, code, "bench %v: %s", args, errOut)
	require.Empty(t, errOut, "nothing on stderr off a terminal")
	var doc benchDoc
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	return doc
}

// requireNoBenchFiles requires the roots of the mounts to be empty: bench
// made its directory in each and removed it (the tests make nothing
// there).
func requireNoBenchFiles(t *testing.T, ds ...*daemon) {
	t.Helper()
	for _, d := range ds {
		ents, err := os.ReadDir(d.mnt)
		require.NoError(t, err)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		require.Empty(t, names, "left in %s", d.mnt)
	}
}

// TestBenchPeer: bench between two daemons over TCP, and inside one mount:
// the table has a row a point with its path and checks, --json the fields
// its help names (batched calls split over 64 KiB counted as one), --plot
// a PNG; nothing is left in either mount, and both daemons end clean.
func TestBenchPeer(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	png := filepath.Join(t.TempDir(), "bench.png")

	// Flags on both sides of MOUNT.
	out, errOut, code := cli(t, "bench", "--peer", "b", a.mnt, "--sizes", "4K,1M", "--iters", "3", "--check", "1", "--plot", png)
	require.Zero(t, code, errOut)
	require.Empty(t, errOut)
	t.Logf("tensorfs bench:\n%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2+8, "title, header, 2 modes x 2 dirs x 2 sizes")
	require.Equal(t, "tensorfs bench "+a.mnt+" (a), to and from b: 1 descriptor per call, 3 timed calls per point", lines[0])
	require.Equal(t, []string{"MODE", "DIR", "SIZE", "BATCH", "CALLS", "P50", "P99", "GB/S", "PATH", "CHECKED"}, strings.Fields(lines[1]))
	var rows []string
	for _, l := range lines[2:] {
		f := strings.Fields(l)
		require.Len(t, f, 13, l) // sizes and latencies are two words each
		require.Equal(t, []string{"1", "3"}, f[4:6], "batch, calls: %s", l)
		require.Equal(t, []string{"tcp", "1"}, f[11:], "path, checked: %s", l)
		rows = append(rows, strings.Join(f[:4], " "))
	}
	require.Equal(t, []string{
		"inplace push 4.0 KiB", "inplace pull 4.0 KiB", "inplace push 1.0 MiB", "inplace pull 1.0 MiB",
		"whole push 4.0 KiB", "whole pull 4.0 KiB", "whole push 1.0 MiB", "whole pull 1.0 MiB",
	}, rows)
	img, err := os.ReadFile(png)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(img, []byte("\x89PNG\r\n\x1a\n")), "a PNG")
	require.Greater(t, len(img), 20<<10, "a drawing, not an empty image")
	requireNoBenchFiles(t, a, b)

	doc := benchJSON(t, a.mnt, "--peer", "b", "--sizes", "4K", "--batch", "3", "--iters", "2", "--modes", "whole,inplace")
	require.Equal(t, a.mnt, doc.Mount)
	require.Equal(t, "a", doc.Node)
	require.Equal(t, "b", doc.Peer)
	require.Equal(t, 3, doc.Batch)
	require.Equal(t, 2, doc.Iters)
	require.Len(t, doc.Results, 4)
	for i, r := range doc.Results {
		require.Equal(t, []string{"whole", "whole", "inplace", "inplace"}[i], r.Mode, "in the order given")
		require.Equal(t, []string{"push", "pull"}[i%2], r.Dir)
		require.Equal(t, int64(4096), r.Size)
		require.Equal(t, 3, r.Batch)
		require.Equal(t, int64(3*4096), r.BytesPerCall)
		require.Equal(t, 2, r.Calls)
		require.Equal(t, 1, r.WritesPerCall)
		require.Positive(t, r.P50US)
		require.GreaterOrEqual(t, r.P99US, r.P50US)
		require.Positive(t, r.MeanUS)
		require.Positive(t, r.GBPerS)
		require.Equal(t, "tcp", r.Path)
		require.Equal(t, 2, r.Checked, "--check's default")
	}
	requireNoBenchFiles(t, a, b)

	// Inside one mount, 1500 descriptors a call: two setxattrs a call.
	doc = benchJSON(t, b.mnt, "--sizes", "4K", "--batch", "1500", "--modes", "inplace", "--dirs", "push", "--time", "1ms", "--check", "1")
	require.Empty(t, doc.Peer)
	require.Len(t, doc.Results, 1)
	r := doc.Results[0]
	require.Equal(t, "local", r.Path)
	require.Equal(t, 2, r.WritesPerCall)
	require.Equal(t, int64(1500*4096), r.BytesPerCall)
	require.GreaterOrEqual(t, r.Calls, 1, "--time: at least one call")
	require.Equal(t, 1, r.Checked)
	requireNoBenchFiles(t, a, b)
	a.requireClean()
	b.requireClean()
}

// TestBenchBadInput: an unknown peer, a path off tensorfs, sizes that do
// not parse, sizes past the mount's (or the peer's) free space, a peer
// whose mount is not on this host, one that is down, and the mount's own
// node: each one line on stderr, exit 1, nothing on stdout, and nothing
// left in either mount.
func TestBenchBadInput(t *testing.T) {
	gone := fmt.Sprintf("gone=127.0.0.1:%d", testutil.FreePort(t))
	ds := cluster(t, []string{"a", "b"}, "--max-memory", "64MiB", "--peer", gone)
	a, b := ds["a"], ds["b"]
	off := t.TempDir()
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{a.mnt, "--peer", "nosuch"}, []string{"bench " + a.mnt + ": unknown peer nosuch: " + a.mnt + " knows only b, gone"}},
		{[]string{off, "--peer", "b"}, []string{"bench " + off + ": not on a tensorfs mount"}},
		{[]string{a.mnt, "--sizes", "4K,12Q"}, []string{`bench: --sizes "12Q": not a byte size`}},
		{[]string{a.mnt, "--sizes", "4K,1G", "--peer", "b"}, []string{"size 1.0 GiB x batch 1 needs", "on " + a.mnt, "which has", "free (statfs)"}},
		{[]string{a.mnt, "--sizes", "16M", "--peer", "b", "--modes", "whole", "--dirs", "push", "--batch", "4"},
			[]string{"size 16 MiB x batch 4 needs 128 MiB at once on " + b.mnt + " (b's mount)", "which has 64 MiB free (statfs)"}},
		{[]string{a.mnt, "--peer", "gone"}, []string{"peer gone's mount is not on this host", "--leave-peer-dir"}},
		{[]string{a.mnt, "--peer", "gone", "--leave-peer-dir", "--sizes", "4K"}, []string{"creating its directory on gone: copy_to on /tensorfs-bench-", "Connection refused"}},
		{[]string{a.mnt, "--peer", "a"}, []string{"--peer a is this mount's own node"}},
	} {
		out, errOut, code := cli(t, append([]string{"bench"}, tc.args...)...)
		require.Equal(t, 1, code, "%v: %s", tc.args, errOut)
		require.Empty(t, out, "%v", tc.args)
		require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
		require.True(t, strings.HasPrefix(errOut, "tensorfs: bench"), errOut)
		for _, w := range tc.want {
			require.Contains(t, errOut, w, "%v", tc.args)
		}
		t.Logf("bench %v: %s", tc.args, strings.TrimSpace(errOut))
		requireNoBenchFiles(t, a, b)
	}
	a.requireClean()
	b.requireClean()
}

// TestBenchInterrupt: SIGINT in the middle of a bench stops it; it removes
// its directories in both mounts, says so in one line and exits 130.
func TestBenchInterrupt(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	cmd := exec.Command(bin, "bench", a.mnt, "--peer", "b", "--sizes", "4K,64K", "--time", "30s")
	var out, errOut testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	require.NoError(t, cmd.Start())
	// Under way once its directory is on the peer, with a tensor in it.
	deadline := time.Now().Add(20 * time.Second)
	for {
		ms, _ := filepath.Glob(b.path("tensorfs-bench-*", "*"))
		if len(ms) > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "bench did not start: %s", errOut.String())
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	err := cmd.Wait()
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "%v: %s", err, errOut.String())
	require.Equal(t, 130, ee.ExitCode(), errOut.String())
	require.Empty(t, out.String(), "no table for an interrupted bench")
	require.Equal(t, "tensorfs: bench "+a.mnt+": interrupted by SIGINT; its files are removed\n", errOut.String())
	requireNoBenchFiles(t, a, b)
	a.requireClean()
	b.requireClean()
}

// TestBenchPeerOnAnotherHost: bench run where the peer's mount is not in
// the mount table (a mount namespace without it, as on another host) is
// refused before anything is made; with --leave-peer-dir it runs, frees
// the peer's memory as it goes, and names the empty directory it leaves
// there, which is all it leaves.
func TestBenchPeerOnAnotherHost(t *testing.T) {
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare (util-linux) for a mount namespace without the peer's mount")
	}
	// A name no other mount on this host has: bench would take a mount of
	// that name for the peer's (and find it is not).
	peer := fmt.Sprintf("b%d", os.Getpid())
	ds := cluster(t, []string{"a", peer})
	a, b := ds["a"], ds[peer]
	benchElsewhere := func(args ...string) (string, string, int) {
		script := `umount -l "$1" && shift && exec "$@"`
		c := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "sh", "-c", script, "sh", b.mnt, bin, "bench", a.mnt, "--peer", peer}, args...)...)
		var o, e bytes.Buffer
		c.Stdout, c.Stderr = &o, &e
		err := c.Run()
		var ee *exec.ExitError
		code := 0
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		return o.String(), e.String(), code
	}
	_, errOut, code := benchElsewhere("--sizes", "4K")
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "peer "+peer+"'s mount is not on this host (no tensorfs:"+peer+" in /proc/mounts)")
	requireNoBenchFiles(t, a, b)

	out, errOut, code := benchElsewhere("--sizes", "4K,64K", "--iters", "2", "--leave-peer-dir")
	require.Zero(t, code, errOut)
	require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 2+8)
	require.Regexp(t, `^tensorfs: bench `+regexpQuote(a.mnt)+`: left `+peer+`:/tensorfs-bench-[0-9]+ on `+peer+`, an empty directory \(tensorfs cannot remove a peer's files\): remove it on that host\n$`, errOut)
	requireNoBenchFiles(t, a)
	left, err := filepath.Glob(b.path("tensorfs-bench-*"))
	require.NoError(t, err)
	require.Len(t, left, 1)
	require.Equal(t, peer+":/"+filepath.Base(left[0]), strings.Fields(errOut)[4])
	ents, err := os.ReadDir(left[0])
	require.NoError(t, err)
	for _, e := range ents {
		require.Equal(t, "0", getx(t, filepath.Join(left[0], e.Name()), xattrs.NBytes), "%s emptied", e.Name())
	}
	require.Zero(t, b.settledLive().Bytes, "the peer's memory is freed")
	require.NoError(t, os.RemoveAll(left[0]))
	a.requireClean()
	b.requireClean()
}
