package tests

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// tcp runs `tensorfs cp` with args and returns its stdout and stderr apart:
// cp promises to write only to stderr.
func tcp(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var o, e bytes.Buffer
	c := exec.Command(bin, append([]string{"cp"}, args...)...)
	c.Stdout, c.Stderr = &o, &e
	err = c.Run()
	return o.String(), e.String(), err
}

// cpOK runs a cp that must succeed and print nothing on stdout.
func cpOK(t *testing.T, args ...string) (stderr string) {
	t.Helper()
	out, errOut, err := tcp(t, args...)
	require.NoError(t, err, "tensorfs cp %v: %s", args, errOut)
	require.Empty(t, out, "stdout of cp %v", args)
	return errOut
}

// cpFails runs a cp that must fail, with exactly one line on stderr that
// names the command and contains each of want.
func cpFails(t *testing.T, args []string, want ...string) string {
	t.Helper()
	out, errOut, err := tcp(t, args...)
	require.Error(t, err, "tensorfs cp %v succeeded: %s", args, errOut)
	require.Empty(t, out)
	require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
	require.True(t, strings.HasPrefix(errOut, "tensorfs: cp "), errOut)
	for _, w := range want {
		require.Contains(t, errOut, w)
	}
	t.Logf("cp %v: %s", args, strings.TrimSpace(errOut))
	return errOut
}

// sameFile requires the file at p to hold want (without a 64 MiB diff in the
// failure message).
func sameFile(t *testing.T, p string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	require.Equal(t, len(want), len(got), "size of %s", p)
	require.True(t, bytes.Equal(want, got), "bytes of %s", p)
}

// TestCpPush: cp of a 64 MiB tensor to a peer moves its bytes, dtype and
// shape, and prints one summary line on stderr (nothing with --quiet, before
// or after the arguments).
func TestCpPush(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	mkTemplateDir(t, a.path("kv"), "F32", "4096,4096") // 64 MiB
	data := fill(64<<20, 11)
	require.NoError(t, os.WriteFile(a.path("kv/layer0"), data, 0o644))
	require.NoError(t, os.Mkdir(b.path("kv"), 0o755))

	errOut := cpOK(t, a.path("kv/layer0"), "b:/kv/layer0")
	sameFile(t, b.path("kv/layer0"), data)
	require.Equal(t, "F32", getx(t, b.path("kv/layer0"), xattrs.DType))
	require.Equal(t, "4096,4096", getx(t, b.path("kv/layer0"), xattrs.Shape))
	// Not a terminal: no bar, one summary line with the transfer's counts.
	require.Equal(t, 1, strings.Count(errOut, "\n"), "%q", errOut)
	require.Contains(t, errOut, "copied 1 tensor, 67,108,864 bytes (64 MiB)")
	require.Regexp(t, `in [0-9.]+ s, [0-9.]+ ([KMGT]i)?B/s\n$`, errOut)

	// --progress draws the bar anyway; it ends cleared, before the summary.
	errOut = cpOK(t, "--progress", a.path("kv/layer0"), "b:/kv/bar")
	sameFile(t, b.path("kv/bar"), data)
	require.Contains(t, errOut, "copied 1 tensor, 67,108,864 bytes")

	for _, args := range [][]string{
		{"-q", a.path("kv/layer0"), "b:/kv/q1"},
		{a.path("kv/layer0"), "b:/kv/q2", "--quiet"},
	} {
		require.Empty(t, cpOK(t, args...), "%v", args)
	}
	sameFile(t, b.path("kv/q2"), data)
	require.EqualValues(t, 4, b.stats().Copies.TCP)

	os.RemoveAll(a.path("kv"))
	os.RemoveAll(b.path("kv"))
	a.requireClean()
	b.requireClean()
}

// TestCpPull: cp from a peer path replaces an existing file, creates a
// missing one (its directory must exist), and leaves nothing behind when it
// fails.
func TestCpPull(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	mkTemplateDir(t, b.path("kv"), "BF16", "64,8")
	data := fill(1024, 5)
	require.NoError(t, os.WriteFile(b.path("kv/blk"), data, 0o644))

	// Into an existing file, of another size.
	require.NoError(t, os.WriteFile(a.path("old"), []byte("old bytes"), 0o644))
	errOut := cpOK(t, "b:/kv/blk", a.path("old"))
	sameFile(t, a.path("old"), data)
	require.Equal(t, "BF16", getx(t, a.path("old"), xattrs.DType))
	require.Contains(t, errOut, "copied 1 tensor, 1,024 bytes (1.0 KiB), from b:/kv/blk to "+a.path("old"))

	// Into a missing file, named relative to the working directory.
	require.NoError(t, os.Mkdir(a.path("in"), 0o755))
	c := exec.Command(bin, "cp", "-q", "b:/kv/blk", "in/new")
	c.Dir = a.mnt
	out, err := c.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Empty(t, out)
	sameFile(t, a.path("in/new"), data)
	require.Equal(t, "64,8", getx(t, a.path("in/new"), xattrs.Shape))

	// A missing source or a missing directory: nothing is created.
	cpFails(t, []string{"b:/kv/missing", a.path("in/none")}, "No such file")
	_, err = os.Stat(a.path("in/none"))
	require.ErrorIs(t, err, os.ErrNotExist, "the empty DST cp made was removed")
	cpFails(t, []string{"b:/kv/blk", a.path("nodir/x")}, "No such file", "does not exist")

	for _, p := range []string{"old", "in"} {
		require.NoError(t, os.RemoveAll(a.path(p)))
	}
	require.NoError(t, os.RemoveAll(b.path("kv")))
	a.requireClean()
	b.requireClean()
}

// TestCpDir: a directory tree goes to a peer and comes back with cp; a
// directory pull into a missing DST fails with a hint and leaves nothing.
func TestCpDir(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	mkTemplateDir(t, a.path("tree"), "I32", "16")
	for i := 0; i < 30; i++ {
		sub := a.path("tree", fmt.Sprintf("l%d", i%3))
		os.Mkdir(sub, 0o755)
		require.NoError(t, os.WriteFile(filepath.Join(sub, fmt.Sprint(i)), fill(64, byte(i)), 0o644))
	}
	errOut := cpOK(t, a.path("tree"), "b:/tree")
	require.Contains(t, errOut, "copied 30 tensors, 1,920 bytes")
	for i := 0; i < 30; i++ {
		sameFile(t, b.path("tree", fmt.Sprintf("l%d", i%3), fmt.Sprint(i)), fill(64, byte(i)))
	}

	require.NoError(t, os.Mkdir(a.path("back"), 0o755))
	errOut = cpOK(t, "b:/tree/", a.path("back")+"/")
	require.Contains(t, errOut, "copied 30 tensors, 1,920 bytes")
	sameFile(t, a.path("back/l2/29"), fill(64, 29))

	cpFails(t, []string{"b:/tree", a.path("missing")}, "Not a directory", "DST must be an existing directory", "did not exist")
	_, err := os.Stat(a.path("missing"))
	require.ErrorIs(t, err, os.ErrNotExist)

	for _, p := range []string{"tree", "back"} {
		require.NoError(t, os.RemoveAll(a.path(p)))
	}
	require.NoError(t, os.RemoveAll(b.path("tree")))
	a.requireClean()
	b.requireClean()
}

// TestCpLocal: both sides in one mount is a local copy (device to device,
// counted as local); a copy onto itself is refused.
func TestCpLocal(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	mkTemplateDir(t, a.path("w"), "U8", "4096")
	require.NoError(t, os.WriteFile(a.path("w/x"), fill(4096, 2), 0o644))
	errOut := cpOK(t, a.path("w/x"), a.path("w/y"))
	sameFile(t, a.path("w/y"), fill(4096, 2))
	require.Contains(t, errOut, "copied 1 tensor, 4,096 bytes")
	cpOK(t, "-q", a.path("w"), a.path("w2"))
	sameFile(t, a.path("w2/y"), fill(4096, 2))
	require.EqualValues(t, 2, a.stats().Copies.Local)
	require.Zero(t, b.stats().Copies.TCP)

	// Refused before any transfer: the reason comes from stats'
	// errors.recent (a bare "Invalid argument" was all a new user got).
	cpFails(t, []string{a.path("w/x"), a.path("w/x")}, "Invalid argument")
	cpFails(t, []string{a.path("w/x"), a.path("w/x")}, "copy of /w/x onto itself")
	cpFails(t, []string{a.path("w"), a.path("w/sub")}, "into its own subtree")

	for _, p := range []string{"w", "w2"} {
		require.NoError(t, os.RemoveAll(a.path(p)))
	}
	a.requireClean()
	b.requireClean()
}

// TestCpErrors: each failure is a non-zero exit and one line with the
// errno's text and, where the daemon has one, its reason.
func TestCpErrors(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	require.NoError(t, os.WriteFile(a.path("t"), fill(100, 1), 0o644))

	cpFails(t, []string{a.path("t"), "nobody:/t"}, "No such file", `unknown peer "nobody"`)
	cpFails(t, []string{"a:/t", "b:/t"}, "Invalid argument", "both are peer paths")
	cpFails(t, []string{a.path("missing"), "b:/t"}, "No such file", "SRC "+a.path("missing")+" does not exist")
	cpFails(t, []string{t.TempDir(), "b:/t"}, "not in a mounted tensorfs")
	cpFails(t, []string{a.path("t"), "b:t"}, "Invalid argument", "not absolute")
	cpFails(t, []string{a.path("t"), b.path("t")}, "different", "peer path")
	_, err := os.Stat(b.path("t"))
	require.ErrorIs(t, err, os.ErrNotExist, "nothing arrived")

	require.NoError(t, os.Remove(a.path("t")))
	a.requireClean()
	b.requireClean()
}

// TestCopyRecordIDs: every transfer record has an id, never reused, and the
// pid of the process whose setxattr asked for it (none on the peer that was
// asked); concurrent cps of the same SRC and DST each report their own copy.
func TestCopyRecordIDs(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	data := fill(8<<20, 5)
	require.NoError(t, os.WriteFile(a.path("x"), data, 0o644))
	last := func(d *daemon) xattrs.Record {
		r := d.stats().Transfers.Recent
		require.NotEmpty(t, r)
		return r[len(r)-1]
	}
	var ids []uint64
	for range 2 {
		require.NoError(t, unix.Setxattr(a.path("x"), xattrs.CopyTo, []byte("b:/x"), 0))
		r := last(a)
		require.Equal(t, os.Getpid(), r.PID, "the record names the process that asked")
		require.EqualValues(t, 2, r.Streams, "8 MiB takes the default 2 streams")
		ids = append(ids, r.ID)
		require.Zero(t, last(b).PID, "the peer's record names no process")
	}
	require.Greater(t, ids[1], ids[0])

	outs := make(chan string, 2)
	for range 2 {
		go func() {
			_, errOut, err := tcp(t, a.path("x"), "b:/x")
			if err != nil {
				errOut = "failed: " + err.Error() + ": " + errOut
			}
			outs <- errOut
		}()
	}
	for range 2 {
		require.Contains(t, <-outs, "copied 1 tensor, 8,388,608 bytes")
	}
	sameFile(t, b.path("x"), data)
	os.Remove(a.path("x"))
	os.Remove(b.path("x"))
	a.requireClean()
	b.requireClean()
}

// TestCpRanges: cp with ranges writes in place, pushed, pulled and inside
// one mount (the summary counts the range's bytes); a range that does not
// fit fails with one line and writes nothing.
func TestCpRanges(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	src := fill(64<<10, 5)
	require.NoError(t, os.WriteFile(a.path("src"), src, 0o644))
	zeros(t, b.path("cache"), 1<<20)
	zeros(t, a.path("local"), 1<<20)
	before := ids(t, b.path("cache"))
	want := make([]byte, 1<<20)

	errOut := cpOK(t, a.path("src")+"@4096+8192", "b:/cache@65536")
	copy(want[65536:], src[4096:4096+8192])
	require.Contains(t, errOut, "8,192 bytes")
	cpOK(t, a.path("src"), "b:/cache@0x80000")
	copy(want[0x80000:], src)
	sameFile(t, b.path("cache"), want)
	require.Equal(t, before, ids(t, b.path("cache")), "in place: the same registration")

	wantLocal := make([]byte, 1<<20)
	cpOK(t, "b:/cache@65536+100", a.path("local")+"@10")
	copy(wantLocal[10:], want[65536:65636])
	cpOK(t, a.path("src")+"@0+16", a.path("local")+"@1000")
	copy(wantLocal[1000:], src[:16])
	sameFile(t, a.path("local"), wantLocal)

	cpFails(t, []string{a.path("src"), "b:/cache@1048000"}, "Invalid argument")
	cpFails(t, []string{"b:/cache@0+10", a.path("missing") + "@0"}, "No such file or directory")
	sameFile(t, b.path("cache"), want)
}
