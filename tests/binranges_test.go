package tests

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// binRec is one record of a binary range list: its line and its
// descriptors (source offset, destination offset, length).
type binRec struct {
	line  string
	descs [][3]int64
}

// binValue is recs as a binary range list (README "Binary range lists"),
// as a Go client writes one (xattrs.AppendRangeRecord).
func binValue(recs ...binRec) string {
	var b []byte
	for _, r := range recs {
		var ds []xattrs.RangeDesc
		for _, d := range r.descs {
			ds = append(ds, xattrs.RangeDesc{Src: d[0], Dst: d[1], Len: d[2]})
		}
		b = xattrs.AppendRangeRecord(b, r.line, ds)
	}
	return string(b)
}

// textOf is recs as the text lines they stand for: withSrc, a batch's
// "SRC@s+n DST@d"; dstRange, a copy_from's "SRC@s+n @d"; else a copy_to's
// "@s+n DST@d".
func textOf(recs []binRec, withSrc, dstRange bool) string {
	var lines []string
	for _, r := range recs {
		if len(r.descs) == 0 {
			lines = append(lines, r.line)
			continue
		}
		for _, d := range r.descs {
			switch {
			case dstRange:
				lines = append(lines, fmt.Sprintf("%s@%d+%d @%d", r.line, d[0], d[2], d[1]))
			case withSrc:
				src, dst, _ := strings.Cut(r.line, " ")
				lines = append(lines, fmt.Sprintf("%s@%d+%d %s@%d", src, d[0], d[2], dst, d[1]))
			default:
				lines = append(lines, fmt.Sprintf("@%d+%d %s@%d", d[0], d[2], r.line, d[1]))
			}
		}
	}
	return strings.Join(lines, "\n")
}

// scatter is n descriptors of blk bytes from consecutive blocks of a
// source at block from, into n distinct blocks of [at, at+span) of a
// destination, shuffled by seed. Destinations do not overlap: overlapping
// in-place ranges race (a GPU's scatter kernel writes them at once), and
// the text and binary runs would keep different bytes.
func scatter(n, from, at, span int, blk int64, seed uint64) [][3]int64 {
	var ds [][3]int64
	for i, slot := range rand.New(rand.NewPCG(seed, 1)).Perm(span)[:n] {
		ds = append(ds, [3]int64{int64(from+i) * blk, int64(at+slot) * blk, blk})
	}
	return ds
}

// TestBinaryRangeLists: a binary range list does what the text lines it
// stands for do, on every path, for copy_to, batch (with a source on a
// peer, a destination in this mount and a notification line) and
// copy_from: the same bytes in the same tensors (ids kept), one transfer
// per peer, the same descriptors counted.
func TestBinaryRangeLists(t *testing.T) {
	onBothPaths(t, func(t *testing.T, a, b *daemon, path string) {
		const blk = 512
		src := fill(64*blk, 3)
		writeTensor(t, a.path("src"), src)
		writeTensor(t, a.path("src2"), fill(32*blk, 9))
		writeTensor(t, b.path("peersrc"), fill(16*blk, 5))
		writeTensor(t, a.path("note"), []byte("request 1"))
		cases := []struct {
			name, on, attr string
			recs           []binRec
			withSrc, pull  bool
		}{
			{"copy_to", a.path("src"), xattrs.CopyTo, []binRec{
				{"b:/d0", scatter(40, 0, 0, 44, blk, 1)},
				{"b:/d1", scatter(20, 40, 0, 48, blk, 5)},
				{"b:/d0", scatter(3, 60, 44, 4, blk, 7)}, // the first list again
				{"/loc", scatter(5, 10, 0, 48, blk, 2)},  // this mount
			}, false, false},
			{"batch", a.mnt, xattrs.Batch, []binRec{
				{"/src b:/d0", scatter(40, 0, 0, 48, blk, 3)},
				{"/src2 b:/d1", scatter(30, 0, 0, 48, blk, 4)},
				{"b:/peersrc /loc", scatter(16, 0, 0, 24, blk, 6)}, // a pull: the general parser's
				{"/src /loc", scatter(4, 20, 24, 24, blk, 8)},
				{"/note b:/ready", nil}, // the notification, last
			}, true, false},
			{"copy_from", a.path("loc"), xattrs.CopyFrom, []binRec{
				{"b:/peersrc", scatter(16, 0, 0, 24, blk, 9)},
				{"b:/d0", scatter(8, 2, 24, 24, blk, 1)},
			}, false, true},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				var got [2]map[string][]byte
				for k, value := range []string{textOf(c.recs, c.withSrc, c.pull), binValue(c.recs...)} {
					for _, d := range []string{"d0", "d1"} {
						zeros(t, b.path(d), 48*blk)
					}
					zeros(t, a.path("loc"), 48*blk)
					if c.pull {
						// Pull the peer's scattered bytes of a
						// previous push.
						writeTensor(t, b.path("d0"), fill(48*blk, 4))
					}
					os.Remove(b.path("ready"))
					ids := tensorIDs(t, b.path("d0"), a.path("loc"))
					before := a.stats()
					setx(t, c.on, c.attr, value)
					after := a.stats()
					require.Equal(t, ids, tensorIDs(t, b.path("d0"), a.path("loc")), "in place: same mr_id, ipc_id, generation")
					snap := map[string][]byte{}
					for _, p := range []string{b.path("d0"), b.path("d1"), a.path("loc")} {
						snap[p], _ = os.ReadFile(p)
					}
					snap["ready"], _ = os.ReadFile(b.path("ready"))
					snap["descriptors"] = []byte(fmt.Sprint(after.Copies.Descriptors - before.Copies.Descriptors))
					snap["copies"] = []byte(fmt.Sprint(allPaths(after.Copies.Paths) - allPaths(before.Copies.Paths)))
					got[k] = snap
				}
				require.Equal(t, got[0], got[1], "binary and text differ")
				if c.name == "batch" {
					require.Equal(t, "request 1", string(got[1]["ready"]))
				}
				changed := false
				for _, d := range []string{b.path("d0"), a.path("loc")} {
					changed = changed || strings.Trim(string(got[1][d]), "\x00") != ""
				}
				require.True(t, changed, "the copies wrote nothing")
			})
		}
	})
}

// tensorIDs is the mr_id, ipc_id and generation of each path.
func tensorIDs(t *testing.T, paths ...string) []string {
	t.Helper()
	var ids []string
	for _, p := range paths {
		for _, n := range []string{xattrs.MRID, xattrs.IPCID, xattrs.Generation} {
			buf := make([]byte, 64)
			k, err := unix.Getxattr(p, n, buf)
			require.NoError(t, err, "%s %s", p, n)
			ids = append(ids, string(buf[:k]))
		}
	}
	return ids
}

// TestBinaryRangeListRefusals: a malformed binary range list, or one whose
// descriptors are refused as their lines would be, is EINVAL (ENOENT for a
// missing destination) and writes nothing anywhere.
func TestBinaryRangeListRefusals(t *testing.T) {
	a, b := pairOn(t, copyPaths(false)[0])
	writeTensor(t, a.path("src"), fill(4096, 2))
	zeros(t, b.path("dst"), 8192)
	zeros(t, a.path("loc"), 8192)
	snap := snapMounts(a, b)
	before := snap()
	good := binRec{"b:/dst", [][3]int64{{0, 0, 100}, {100, 200, 100}}}
	full := binValue(good)
	for _, c := range []struct {
		name, on, attr, v string
		want              syscall.Errno
	}{
		{"another header", a.path("src"), xattrs.CopyTo, "\x00ranges9\nb:/dst\n\x00\x00\x00\x00", syscall.EINVAL},
		{"header alone", a.path("src"), xattrs.CopyTo, xattrs.RangeListMagic, syscall.EINVAL},
		{"no line end", a.path("src"), xattrs.CopyTo, xattrs.RangeListMagic + "b:/dst", syscall.EINVAL},
		{"no count", a.path("src"), xattrs.CopyTo, xattrs.RangeListMagic + "b:/dst\n\x01", syscall.EINVAL},
		{"cut short", a.path("src"), xattrs.CopyTo, full[:len(full)-1], syscall.EINVAL},
		{"count past the end", a.path("src"), xattrs.CopyTo, binValue(good) + "b:/dst\n\x05\x00\x00\x00", syscall.EINVAL},
		{"a NUL in a line", a.path("src"), xattrs.CopyTo, binValue(binRec{"b:/d\x00st", [][3]int64{{0, 0, 1}}}), syscall.EINVAL},
		{"negative", a.path("src"), xattrs.CopyTo, binValue(good, binRec{"b:/dst", [][3]int64{{0, -1, 1}}}), syscall.EINVAL},
		{"past the destination", a.path("src"), xattrs.CopyTo, binValue(good, binRec{"b:/dst", [][3]int64{{0, 8100, 100}}}), syscall.EINVAL},
		{"past the source", a.path("src"), xattrs.CopyTo, binValue(good, binRec{"b:/dst", [][3]int64{{4000, 0, 100}}}), syscall.EINVAL},
		{"past the local destination", a.path("src"), xattrs.CopyTo, binValue(good, binRec{"/loc", [][3]int64{{0, 8100, 100}}}), syscall.EINVAL},
		{"missing destination", a.path("src"), xattrs.CopyTo, binValue(good, binRec{"b:/missing", [][3]int64{{0, 0, 1}}}), syscall.ENOENT},
		{"a range in the line", a.path("src"), xattrs.CopyTo, binValue(binRec{"b:/dst@0", [][3]int64{{0, 0, 1}}}), syscall.ENOENT},
		{"batch line of one path", a.mnt, xattrs.Batch, binValue(binRec{"/src", [][3]int64{{0, 0, 1}}}), syscall.EINVAL},
		{"batch past the source", a.mnt, xattrs.Batch, binValue(binRec{"/src b:/dst", [][3]int64{{0, 0, 1}, {4090, 0, 10}}}), syscall.EINVAL},
		{"batch bad text record", a.mnt, xattrs.Batch, binValue(binRec{"/src b:/dst", [][3]int64{{0, 0, 1}}}, binRec{"/src", nil}), syscall.EINVAL},
		{"copy_from line of two paths", a.path("loc"), xattrs.CopyFrom, binValue(binRec{"b:/dst /x", [][3]int64{{0, 0, 1}}}), syscall.EINVAL},
		{"copy_from past the destination", a.path("loc"), xattrs.CopyFrom, binValue(binRec{"b:/dst", [][3]int64{{0, 0, 1}, {0, 8190, 10}}}), syscall.EINVAL},
		{"unknown peer", a.path("src"), xattrs.CopyTo, binValue(good, binRec{"zz:/dst", [][3]int64{{0, 0, 1}}}), syscall.ENOENT},
		// A record's paths are paths: "#..." is no comment there (it was
		// dropped, and the call succeeded); an empty text record alone is
		// no copy (copy_to ran an empty plan).
		{"a comment as a source", a.mnt, xattrs.Batch, binValue(binRec{"#src b:/dst", [][3]int64{{0, 0, 100}}}), syscall.EINVAL},
		{"a comment as a source, with a good record", a.mnt, xattrs.Batch, binValue(binRec{"/src b:/dst", [][3]int64{{0, 0, 100}}}, binRec{"#src b:/dst", [][3]int64{{0, 0, 100}}}), syscall.EINVAL},
		{"a comment as a destination", a.path("src"), xattrs.CopyTo, binValue(binRec{"#/dst", [][3]int64{{0, 0, 100}}}), syscall.EINVAL},
		{"a comment as a pull's source", a.path("loc"), xattrs.CopyFrom, binValue(binRec{"#/src", [][3]int64{{0, 0, 100}}}), syscall.EINVAL},
		{"a peer named #b", a.path("src"), xattrs.CopyTo, binValue(binRec{"#b:/dst", [][3]int64{{0, 0, 100}}}), syscall.ENOENT},
		{"an empty text record", a.path("src"), xattrs.CopyTo, binValue(binRec{"", nil}), syscall.EINVAL},
		{"an empty text record, batch", a.mnt, xattrs.Batch, binValue(binRec{"", nil}), syscall.EINVAL},
		{"an empty text record, copy_from", a.path("loc"), xattrs.CopyFrom, binValue(binRec{" ", nil}), syscall.EINVAL},
		{"the peer's root", a.path("src"), xattrs.CopyTo, binValue(binRec{"b:/", [][3]int64{{0, 0, 1}}}), syscall.EISDIR},
		// Several faults: the error of the text lines the records stand
		// for (the first line the general parser refuses, before any
		// path is looked up).
		{"a missing source before a malformed destination", a.mnt, xattrs.Batch, binValue(binRec{"/missing rel", [][3]int64{{0, 0, 0}}}), syscall.ENOENT},
		{"overflow before a missing source", a.mnt, xattrs.Batch, binValue(binRec{"/nope b:/dst", [][3]int64{{1, 9223372036854775807, 9223372036854775807}}}), syscall.EINVAL},
		{"a pull's bad line before a later source", a.mnt, xattrs.Batch, binValue(binRec{"b:/dst b:/co:lon", [][3]int64{{1961, 2438, 54}}}, binRec{"/src/x b:/dst", [][3]int64{{0, 0, 1}}}), syscall.EINVAL},
	} {
		err := unix.Setxattr(c.on, c.attr, []byte(c.v), 0)
		require.ErrorIs(t, err, c.want, c.name)
		require.Equal(t, before, snap(), "%s wrote something", c.name)
	}
	// The log names a binary value by its size, not its bytes.
	a.requireLog(`value="<binary range list, `)
	for _, d := range []*daemon{a, b} {
		require.Zero(t, d.stats().Live.Pins)
	}
	setx(t, a.path("src"), xattrs.CopyTo, full)
	got, err := os.ReadFile(b.path("dst"))
	require.NoError(t, err)
	want := make([]byte, 8192)
	src := fill(4096, 2)
	copy(want[0:100], src[0:100])
	copy(want[200:300], src[100:200])
	require.Equal(t, want, got)
}
