package tests

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// ids are a tensor's registration: what an in-place copy must keep.
func ids(t *testing.T, p string) [3]string {
	t.Helper()
	return [3]string{getx(t, p, xattrs.MRID), getx(t, p, xattrs.IPCID), getx(t, p, xattrs.Generation)}
}

// mapped is a tensor mapped through its exported memfd, as a local
// importer maps it: the open file (its lease) and the mapping.
type mapped struct {
	f   *os.File
	mem []byte // the tensor's bytes
	all []byte // the whole mapping (page-aligned)
}

// mapTensor maps host tensor p read-only through its ipc_handle. A
// tensor in GPU memory (the suite run with TENSORFS_TEST_DEVICE=cuda:0)
// skips the test: TestGPUInPlace maps it by its CUDA IPC handle instead.
func mapTensor(t *testing.T, p string) *mapped {
	t.Helper()
	return mapTensorProt(t, p, unix.PROT_READ)
}

// mapTensorRW is mapTensor, read-write: a process that writes the tensor
// through its mapping.
func mapTensorRW(t *testing.T, p string) *mapped {
	t.Helper()
	return mapTensorProt(t, p, unix.PROT_READ|unix.PROT_WRITE)
}

// mapTensorProt is mapTensor with the mapping's protection prot.
func mapTensorProt(t *testing.T, p string, prot int) *mapped {
	t.Helper()
	h := getx(t, p, xattrs.IPCHandle)
	if strings.HasPrefix(h, "cuda:") {
		t.Skipf("%s is in GPU memory: this test maps a host tensor's memfd; TestGPUInPlace maps GPU tensors by their CUDA IPC handle", p)
	}
	f, err := os.Open(p)
	require.NoError(t, err)
	fdPath, ok := strings.CutPrefix(h, "memfd:")
	require.True(t, ok, "a host tensor's handle: %s", h)
	off, err := strconv.ParseInt(getx(t, p, xattrs.IPCOffset), 10, 64)
	require.NoError(t, err)
	n, err := strconv.ParseInt(getx(t, p, xattrs.NBytes), 10, 64)
	require.NoError(t, err)
	flag := os.O_RDONLY
	if prot&unix.PROT_WRITE != 0 {
		flag = os.O_RDWR
	}
	mf, err := os.OpenFile(fdPath, flag, 0)
	require.NoError(t, err)
	defer mf.Close()
	page := int64(os.Getpagesize())
	base := off / page * page
	all, err := unix.Mmap(int(mf.Fd()), base, int(off-base+n), prot, unix.MAP_SHARED)
	require.NoError(t, err)
	m := &mapped{f: f, all: all, mem: all[off-base : off-base+n]}
	t.Cleanup(m.close)
	return m
}

func (m *mapped) close() {
	if m.all != nil {
		unix.Munmap(m.all)
		m.all, m.mem = nil, nil
		m.f.Close()
	}
}

// zeros makes a tensor of n zero bytes at p.
func zeros(t *testing.T, p string, n int64) {
	t.Helper()
	require.NoError(t, os.WriteFile(p, nil, 0o644))
	require.NoError(t, os.Truncate(p, n))
}

// TestInPlaceCopies: a range on the destination writes into the existing
// tensor, on the local, IPC and TCP paths, by copy_to, copy_from and batch:
// the destination keeps mr_id, ipc_id and generation; a process that mapped
// it before the copy sees the new bytes through that mapping; bytes outside
// the ranges are untouched; stats count the copies as in place.
func TestInPlaceCopies(t *testing.T) {
	onBothPaths(t, func(t *testing.T, a, b *daemon, path string) {
		const size = 256 << 10
		src := fill(64<<10, 3)
		writeTensor(t, a.path("src"), src)
		zeros(t, b.path("cache"), size)
		want := make([]byte, size)
		before := ids(t, b.path("cache"))
		m := mapTensor(t, b.path("cache"))

		// The whole source at an offset.
		setx(t, a.path("src"), xattrs.CopyTo, "b:/cache@131072")
		copy(want[131072:], src)
		// A range of the source (hex accepted), length given on both.
		setx(t, a.path("src"), xattrs.CopyTo, "@0x1000+8192 b:/cache@0+8192")
		copy(want[0:], src[4096:4096+8192])
		// Several lines: one call, one transfer.
		setx(t, a.path("src"), xattrs.CopyTo, "@0+100 b:/cache@200000\n@100+100 b:/cache@200100")
		copy(want[200000:], src[:200])
		// A block list that writes blocks again: its lines add up to more
		// than the destination holds, each inside it (the same bytes each
		// time, so that the order of the rewrites does not matter).
		var lines []string
		for i := range 40 {
			k := i % 8
			lines = append(lines, fmt.Sprintf("@%d+8192 b:/cache@%d", k*8192, 65536+k*8192))
		}
		setx(t, a.path("src"), xattrs.CopyTo, strings.Join(lines, "\n"))
		copy(want[65536:], src)
		// A pull in place, from a range of the peer's tensor.
		zeros(t, a.path("local"), 4096)
		writeTensor(t, b.path("blk"), fill(4096, 9))
		setx(t, a.path("local"), xattrs.CopyFrom, "b:/blk@1024+1024 @2048")
		wantLocal := make([]byte, 4096)
		copy(wantLocal[2048:], fill(4096, 9)[1024:2048])
		requireContent(t, a.path("local"), wantLocal)

		require.True(t, bytes.Equal(want, m.mem), "the mapping made before the copies sees their bytes, and only theirs")
		requireContent(t, b.path("cache"), want)
		require.Equal(t, before, ids(t, b.path("cache")), "mr_id, ipc_id and generation are kept")
		st := a.stats()
		require.EqualValues(t, 5, allPaths(st.Copies.InPlace), "%+v", st.Copies)
		require.EqualValues(t, 5, ofPath(st.Copies.InPlace, path), "%+v", st.Copies)
		require.EqualValues(t, 64<<10+8192+200+40*8192+1024, allPaths(st.Copies.Bytes), "%+v", st.Copies)
		for _, r := range st.Transfers.Recent {
			require.Equal(t, "in_place", r.Mode, "%+v", r)
		}
		m.close()
		for _, d := range []*daemon{a, b} {
			require.Zero(t, d.stats().Live.Pins)
		}
	})
}

// TestInPlacePullList: a copy_from of many in-place lines from one peer
// tensor (and a batch pulling the same way) is one transfer, a range-list
// get, on the IPC and TCP paths: unsorted and adjacent destinations, every
// byte where its line says, nothing else touched, the destination's
// registration kept. A line outside either tensor fails the whole call
// with EINVAL before a byte lands.
func TestInPlacePullList(t *testing.T) {
	onBothPaths(t, func(t *testing.T, a, b *daemon, path string) {
		const blk, n = 4096, 64
		src := fill(n*blk, 5)
		writeTensor(t, b.path("kv"), src)
		zeros(t, a.path("cache"), 2*n*blk)
		before := ids(t, a.path("cache"))
		want := make([]byte, 2*n*blk)
		perm := rand.New(rand.NewSource(7)).Perm(2 * n)[:n]
		var lines []string
		for i, j := range perm {
			lines = append(lines, fmt.Sprintf("b:/kv@%d+%d @%d", i*blk, blk, j*blk))
			copy(want[j*blk:], src[i*blk:(i+1)*blk])
		}
		// Two adjacent half blocks into one block, and a line without
		// a destination length.
		lines = append(lines, fmt.Sprintf("b:/kv@0+%d @%d", blk/2, (2*n-1)*blk), fmt.Sprintf("b:/kv@%d+%d @%d", blk/2, blk/2, (2*n-1)*blk+blk/2))
		copy(want[(2*n-1)*blk:], src[:blk])
		recent := len(a.stats().Transfers.Recent)
		setx(t, a.path("cache"), xattrs.CopyFrom, strings.Join(lines, "\n"))
		requireContent(t, a.path("cache"), want)
		require.Equal(t, before, ids(t, a.path("cache")), "mr_id, ipc_id and generation are kept")
		st := a.stats()
		got := st.Transfers.Recent[min(recent, len(st.Transfers.Recent)):]
		require.Len(t, got, 1, "one call, one transfer: %+v", got)
		require.Equal(t, "in_place", got[0].Mode, "%+v", got[0])
		require.EqualValues(t, (n+1)*blk, got[0].BytesTotal, "%+v", got[0])
		require.Equal(t, path, got[0].Path, "%+v", got[0])

		// The same through batch on the root: one transfer too.
		zeros(t, a.path("c2"), 2*blk)
		recent = len(a.stats().Transfers.Recent)
		setx(t, a.mnt, xattrs.Batch, fmt.Sprintf("b:/kv@%d+%d /c2@%d\nb:/kv@0+%d /c2@0", blk, blk, blk, blk))
		wantC2 := append(append([]byte{}, src[:blk]...), src[blk:2*blk]...)
		requireContent(t, a.path("c2"), wantC2)
		require.Len(t, a.stats().Transfers.Recent[recent:], 1)

		// One bad line, outside the peer's tensor or outside ours: EINVAL,
		// and not one byte written.
		for _, bad := range []string{
			fmt.Sprintf("b:/kv@0+%d @0\nb:/kv@%d+%d @%d", blk, n*blk, blk, blk),
			fmt.Sprintf("b:/kv@0+%d @0\nb:/kv@0+%d @%d", blk, blk, 2*n*blk),
		} {
			err := unix.Setxattr(a.path("cache"), xattrs.CopyFrom, []byte(bad), 0)
			require.ErrorIs(t, err, syscall.EINVAL, "%q", bad)
			requireContent(t, a.path("cache"), want)
		}
		for _, d := range []*daemon{a, b} {
			require.Zero(t, d.stats().Live.Pins)
		}
	})
}

// TestInPlaceLocal: inside one mount, a copy_to into a range of another
// tensor, and into its own bytes elsewhere, writes in place (one batch);
// a caller without write permission on the destination is refused.
func TestInPlaceLocal(t *testing.T) {
	// --allow-other: else nobody's refusal below is the kernel's, for
	// any user but root, and would pass without the permission check.
	d := startDaemon(t, "--allow-other")
	src := fill(8192, 5)
	writeTensor(t, d.path("src"), src)
	zeros(t, d.path("dst"), 32768)
	before := ids(t, d.path("dst"))
	setx(t, d.path("src"), xattrs.CopyTo, "/dst@4096\n@0+10 /dst@0")
	want := make([]byte, 32768)
	copy(want[4096:], src)
	copy(want, src[:10])
	requireContent(t, d.path("dst"), want)
	require.Equal(t, before, ids(t, d.path("dst")))
	// Onto itself, elsewhere in its own bytes: nothing is renamed.
	setx(t, d.path("dst"), xattrs.CopyTo, "@4096+100 /dst@30000")
	copy(want[30000:], want[4096:4196])
	requireContent(t, d.path("dst"), want)
	// A block list whose lines add up to more than the destination holds
	// (blocks written again, with the same bytes), each line inside it.
	var lines []string
	for i := range 20 {
		lines = append(lines, fmt.Sprintf("@%d+2048 /dst@%d", (i%4)*2048, 16384+(i%4)*2048))
	}
	setx(t, d.path("src"), xattrs.CopyTo, strings.Join(lines, "\n"))
	copy(want[16384:], src)
	requireContent(t, d.path("dst"), want)
	require.EqualValues(t, 3, d.stats().Copies.InPlace.Local)

	needOtherUsers(t, "setfattr")
	openToOthers(d.mnt)
	require.NoError(t, os.Chmod(d.mnt, 0o777))
	require.NoError(t, os.Chmod(d.path("dst"), 0o644))
	writeTensor(t, d.path("theirs"), fill(100, 1))
	require.NoError(t, os.Chown(d.path("theirs"), 65534, 65534))
	out, err := asNobody("setfattr", "-n", xattrs.CopyTo, "-v", "/dst@0", d.path("theirs"))
	require.Error(t, err, "nobody may not write root's 0644 tensor in place: %s", out)
	require.Contains(t, out, "Permission denied")
	requireContent(t, d.path("dst"), want)
	d.requireLog("may not write the in-place destination")
	// Its own tensor, nobody may write.
	out, err = asNobody("setfattr", "-n", xattrs.CopyTo, "-v", "@0+10 /theirs@50", d.path("theirs"))
	require.NoError(t, err, out)
	theirs := fill(100, 1)
	copy(theirs[50:], theirs[:10])
	requireContent(t, d.path("theirs"), theirs)
}

// TestInPlaceBatch: 1000 lines across several tensors of the peer, at
// unsorted, adjacent and overlapping offsets, ending with a whole-tensor
// notification line: a watcher that reads the in-place bytes when the
// notification appears finds them all there.
func TestInPlaceBatch(t *testing.T) {
	for _, p := range copyPaths(true) {
		t.Run(p.name, func(t *testing.T) {
			a, b := pairOn(t, p)
			const block = 256
			src := fill(1000*block, 1)
			writeTensor(t, a.path("blocks"), src)
			writeTensor(t, a.path("note"), []byte("request 7"))
			require.NoError(t, os.Mkdir(b.path("kv"), 0o755))
			var maps [4]*mapped
			wants := make([][]byte, 4)
			for l := range maps {
				zeros(t, b.path("kv", fmt.Sprint(l)), 600*block)
				maps[l] = mapTensor(t, b.path("kv", fmt.Sprint(l)))
				wants[l] = make([]byte, 600*block)
			}
			rng := rand.New(rand.NewSource(1))
			var lines []string
			for i := 0; i < 999; i++ {
				l := i % 4
				// Mostly scattered whole blocks; some unaligned, so that
				// ranges overlap their neighbours (later lines win: one
				// descriptor list, moved in order on one stream).
				off := int64(rng.Intn(599)) * block
				if i%50 == 0 {
					off += block / 2
				}
				lines = append(lines, fmt.Sprintf("/blocks@%d+%d b:/kv/%d@%d", i*block, block, l, off))
				copy(wants[l][off:], src[i*block:(i+1)*block])
			}
			lines = append(lines, "/note b:/kv/ready")
			fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
			require.NoError(t, err)
			defer unix.Close(fd)
			_, err = unix.InotifyAddWatch(fd, b.path("kv"), unix.IN_MOVED_TO|unix.IN_CREATE)
			require.NoError(t, err)
			seen := make(chan [][]byte, 1)
			go func() {
				buf := make([]byte, 4096)
				for {
					n, err := unix.Read(fd, buf)
					if err != nil {
						seen <- nil
						return
					}
					for off := 0; off < n; {
						ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
						name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
						if name == "ready" {
							var got [][]byte
							for _, m := range maps {
								got = append(got, bytes.Clone(m.mem))
							}
							seen <- got
							return
						}
						off += unix.SizeofInotifyEvent + int(ev.Len)
					}
				}
			}()
			setx(t, a.mnt, xattrs.Batch, strings.Join(lines, "\n"))
			var got [][]byte
			select {
			case got = <-seen:
			case <-time.After(10 * time.Second):
				t.Fatal("no IN_MOVED_TO for the notification")
			}
			for l := range maps {
				require.True(t, bytes.Equal(wants[l], got[l]), "layer %d complete when the notification appeared", l)
				require.True(t, bytes.Equal(wants[l], maps[l].mem), "layer %d", l)
			}
			requireContent(t, b.path("kv", "ready"), []byte("request 7"))
			st := a.stats()
			require.EqualValues(t, 1, ofPath(st.Copies.Paths, p.path), "one transfer: %+v", st.Copies)
			require.EqualValues(t, 1000, st.Copies.Descriptors, "%+v", st.Copies)
			for _, m := range maps {
				m.close()
			}
		})
	}
}

// TestInPlaceRefusals: an out-of-range destination, a missing one, a length
// mismatch, a range on a directory other than @0, a @0 tree with one size
// mismatch, a malformed range: EINVAL or ENOENT, and not one byte written
// anywhere.
func TestInPlaceRefusals(t *testing.T) {
	onPaths(t, false, func(t *testing.T, a, b *daemon, _ string) { inPlaceRefusals(t, a, b) })
}

func inPlaceRefusals(t *testing.T, a, b *daemon) {
	writeTensor(t, a.path("src"), fill(4096, 2))
	zeros(t, b.path("dst"), 8192)
	require.NoError(t, os.Mkdir(a.path("tree"), 0o755))
	require.NoError(t, os.Mkdir(b.path("tree"), 0o755))
	for i, n := range []int{100, 200, 300} {
		writeTensor(t, a.path("tree", fmt.Sprint(i)), fill(n, byte(i)))
		size := n
		if i == 2 {
			size = 301 // one size mismatch
		}
		zeros(t, b.path("tree", fmt.Sprint(i)), int64(size))
	}
	zeros(t, a.path("loc"), 8192) // a destination of lines into a's own mount
	require.NoError(t, os.Mkdir(a.path("empty"), 0o755))
	snap := snapMounts(a, b)
	before := snap()
	for _, c := range []struct {
		on, attr, v string
		want        syscall.Errno
	}{
		{a.path("src"), xattrs.CopyTo, "b:/dst@8000", syscall.EINVAL},                                   // past the end
		{a.path("src"), xattrs.CopyTo, "b:/dst@9223372036854775807", syscall.EINVAL},                    // ends past 2^63 (was EPROTO from the peer)
		{a.mnt, xattrs.Batch, "/src@0+1 b:/dst@9223372036854775807\n/src@0+1 b:/dst@0", syscall.EINVAL}, // a range list's span, likewise
		{a.path("src"), xattrs.CopyTo, "b:/dst@4096+4097", syscall.EINVAL},                              // length mismatch
		{a.path("src"), xattrs.CopyTo, "@0+10 b:/dst@0+11", syscall.EINVAL},                             // length mismatch
		{a.path("src"), xattrs.CopyTo, "@4000+100 b:/dst@0", syscall.EINVAL},                            // source range past its end
		{a.path("src"), xattrs.CopyTo, "b:/missing@0", syscall.ENOENT},                                  // no destination
		{a.path("src"), xattrs.CopyTo, "b:/dst@99999999999999999999", syscall.EINVAL},                   // does not fit
		{a.path("src"), xattrs.CopyTo, "b:/dst@0\nb:/dst@5000", syscall.EINVAL},                         // one line of two out of range
		// Lines between two tensors travel as one range list: its third
		// span is outside the source, or the destination, or too long.
		{a.path("src"), xattrs.CopyTo, "@0+10 b:/dst@0\n@10+10 b:/dst@100\n@4090+10 b:/dst@200", syscall.EINVAL},
		{a.path("src"), xattrs.CopyTo, "@0+10 b:/dst@0\n@10+10 b:/dst@100\n@20+10 b:/dst@8190", syscall.EINVAL},
		{a.path("src"), xattrs.CopyTo, "@0+10 b:/dst@0\n@10+10 b:/dst@100\n@20+10 b:/dst@200+11", syscall.EINVAL},
		{a.mnt, xattrs.Batch, "/src@0+10 /src@100\n/src@10+10 /src@5000", syscall.EINVAL}, // the local path: src holds 4096
		{a.path("tree"), xattrs.CopyTo, "b:/tree@0", syscall.EINVAL},                      // one size mismatch
		{a.path("tree"), xattrs.CopyTo, "b:/tree@100", syscall.EINVAL},                    // a directory range other than @0
		{a.path("tree"), xattrs.CopyTo, "@0 b:/tree@0", syscall.EINVAL},                   // a source range on a directory
		{a.mnt, xattrs.Batch, "/src b:/dst@0\n/src b:/missing@0", syscall.ENOENT},
		{a.mnt, xattrs.Batch, "/src b:/dst@0\n/src b:/nodir/x", syscall.ENOENT}, // one transfer, the whole line's parent missing
		// Lines into this mount, a peer's refused in-place line and a
		// whole line to it (the notification): the peer's lines went as
		// one transfer after the local bytes had landed.
		{a.mnt, xattrs.Batch, "/src@0+16 /loc@0\n/src@0+16 b:/dst@8190\n/src b:/note", syscall.EINVAL},
		{a.mnt, xattrs.Batch, "/src@0+16 /loc@0\n/src@0+16 b:/missing@0\n/src b:/note", syscall.ENOENT},
		{a.path("src"), xattrs.CopyTo, "b:/note\n@0+16 /loc@0\n@0+16 b:/dst@8190", syscall.EINVAL},
		{a.path("src"), xattrs.CopyTo, "@0+10 b:/@0", syscall.EISDIR}, // the peer's root
		// In-place lines, then a notification that its destination
		// refuses (a missing parent, a directory in the way): checked
		// before the in-place bytes move (they were left written).
		{a.mnt, xattrs.Batch, "/src@0+16 b:/dst@0\n/src@0+16 /loc@0\n/src b:/nodir/note", syscall.ENOENT},
		{a.mnt, xattrs.Batch, "/src@0+16 b:/dst@0\n/src@0+16 /loc@0\n/src b:/tree", syscall.EISDIR},
		{a.mnt, xattrs.Batch, "/src@0+16 /loc@0\n/src b:/nodir/note", syscall.ENOENT},
		{a.mnt, xattrs.Batch, "/src@0+16 b:/dst@0\n/src /nodir/note", syscall.ENOENT},
		{a.mnt, xattrs.Batch, "/src@0+16 b:/dst@0\n/src /tree", syscall.EISDIR},
		{a.path("src"), xattrs.CopyTo, "@0+16 b:/dst@0\n@0+16 /loc@0\nb:/nodir/note", syscall.ENOENT},
		// One name, two whole tensors (the peer's EPROTO; here the last
		// won): EINVAL, before anything moves.
		{a.path("src"), xattrs.CopyTo, "b:/dst@0\nb:/new\nb:/new", syscall.EINVAL},
		{a.mnt, xattrs.Batch, "/src /new\n/loc /new", syscall.EINVAL},
		{a.path("loc"), xattrs.CopyFrom, "b:/dst\n/src", syscall.EINVAL}, // two whole tensors into one file
		// A whole line onto itself, after in-place lines: refused before
		// they run (they had landed).
		{a.path("loc"), xattrs.CopyFrom, "/loc\n/src@0+16 @0", syscall.EINVAL},
		{a.path("loc"), xattrs.CopyFrom, "/src@0+16 @0\n/loc", syscall.EINVAL},
		{a.mnt, xattrs.Batch, "/src b:/dst@0+1", syscall.EINVAL},
		// Lines into this mount and to a peer: whichever is refused,
		// neither writes (the local ones are checked first, written
		// last); an unknown peer is refused before any line runs.
		{a.path("src"), xattrs.CopyTo, "@0+4096 b:/dst@5000\n@0+4096 /loc@0", syscall.EINVAL},
		{a.path("src"), xattrs.CopyTo, "@0+4096 /loc@0\n@0+4096 b:/dst@5000", syscall.EINVAL},
		{a.path("src"), xattrs.CopyTo, "@0+4096 b:/dst@0\n@0+4096 /loc@6000", syscall.EINVAL},
		{a.mnt, xattrs.Batch, "/src /loc@0\n/src b:/dst@5000", syscall.EINVAL},
		{a.mnt, xattrs.Batch, "/src b:/dst@0\n/src /loc@4096+4097", syscall.EINVAL},
		{a.path("src"), xattrs.CopyTo, "@0+4096 b:/dst@0\n@0+4096 zz:/dst@0", syscall.ENOENT},
		{a.mnt, xattrs.Batch, "/src /loc@0\nzz:/x@0+10 /loc@0", syscall.ENOENT},
		// A tree with no tensors in place: its destination directory
		// must be there too (it was made).
		{a.path("empty"), xattrs.CopyTo, "b:/nowhere@0", syscall.ENOENT},
		{a.path("empty"), xattrs.CopyTo, "b:/dst@0", syscall.ENOTDIR},
		{a.mnt, xattrs.Batch, "/empty /nowhere@0", syscall.ENOENT},
		{a.mnt, xattrs.Batch, "/empty /loc@0", syscall.ENOTDIR},
		// A file where the in-place destination needs a directory:
		// ENOTDIR, as for a whole copy (these were ENOENT).
		{a.path("tree"), xattrs.CopyTo, "b:/dst@0", syscall.ENOTDIR},
		{a.path("tree"), xattrs.CopyTo, "/loc@0", syscall.ENOTDIR},
		{a.path("src"), xattrs.CopyTo, "b:/dst/x@0", syscall.ENOTDIR},
		{a.mnt, xattrs.Batch, "/src b:/dst/x@0", syscall.ENOTDIR},
		{a.mnt, xattrs.Batch, "b:/tree /loc@0", syscall.ENOTDIR},
		{a.mnt, xattrs.Batch, "/tree /loc@0", syscall.ENOTDIR},
		{a.path("src"), xattrs.CopyTo, "@x b:/dst@0", syscall.EINVAL}, // not a range
		{a.path("src"), xattrs.CopyTo, "b:/dst@12+", syscall.EINVAL},  // a typo, not a new tensor "dst@12+"
		{a.path("src"), xattrs.CopyTo, "b:/dst@-1", syscall.EINVAL},
	} {
		err := unix.Setxattr(c.on, c.attr, []byte(c.v), 0)
		require.ErrorIs(t, err, c.want, "%s %q", c.attr, c.v)
		require.Equal(t, before, snap(), "%s %q wrote something", c.attr, c.v)
	}
	requireContent(t, a.path("src"), fill(4096, 2))
	for _, d := range []*daemon{a, b} {
		require.Zero(t, d.stats().Live.Pins)
	}
	// Refused before any transfer: the reason is in the sender's log
	// (slog's text format: the action's value quoted).
	a.requireLog(`msg=refused attr=user.tensorfs.copy_to on=/src value="@4000+100 b:/dst@0" errno=EINVAL`)
	// Refused by the peer: a failure, with the copy's mode (its record's).
	a.requireLog(`msg="copy failed" src=batch dst=b:/ mode=in_place copied=0 errno=ENOENT`)
	a.requireLog(`msg="copy failed" src=batch dst=b:/ mode=mixed copied=0 errno=ENOENT`)
	for _, p := range []string{b.path("nowhere"), a.path("nowhere")} {
		_, err := os.Stat(p)
		require.ErrorIs(t, err, os.ErrNotExist, "an empty tree in place made its destination")
	}
	// An empty tree in place into a directory: nothing to write.
	setx(t, a.path("empty"), xattrs.CopyTo, "b:/tree@0")
	setx(t, a.mnt, xattrs.Batch, "/empty /tree@0")
	// The same tree with matching sizes is a weight update in place: each
	// tensor keeps its registration, dtype and shape.
	require.NoError(t, os.Truncate(b.path("tree", "2"), 300))
	setx(t, b.path("tree", "2"), xattrs.DType, "U8")
	reg := ids(t, b.path("tree", "1"))
	setx(t, a.path("tree"), xattrs.CopyTo, "b:/tree@0")
	for i, n := range []int{100, 200, 300} {
		requireContent(t, b.path("tree", fmt.Sprint(i)), fill(n, byte(i)))
	}
	require.Equal(t, reg, ids(t, b.path("tree", "1")))
	// In-place lines here and on b, then a notification to b, which its
	// check accepts: all of it lands, the notification last.
	setx(t, a.mnt, xattrs.Batch, "/src@0+16 b:/dst@100\n/src@16+16 /loc@200\n/src b:/note")
	src := fill(4096, 2)
	requireContent(t, b.path("note"), src)
	got, err := os.ReadFile(b.path("dst"))
	require.NoError(t, err)
	require.Equal(t, src[:16], got[100:116])
	got, err = os.ReadFile(a.path("loc"))
	require.NoError(t, err)
	require.Equal(t, src[16:32], got[200:216])
}

// severalPeers makes the tensors of TestInPlaceRefusalsSeveralPeers on a,
// b and c: a:/src (4096 bytes), a:/loc (8192 zeros), b:/dst and c:/dst
// (8192 bytes each), the tree a:/tree (w, x) and its in-place
// destinations a:/tree2 and b:/tree (c:/tree lacks x); snap reads every
// file of the three mounts.
func severalPeers(t *testing.T, a, b, c *daemon) func() map[string][]byte {
	t.Helper()
	writeTensor(t, a.path("src"), fill(4096, 2))
	zeros(t, a.path("loc"), 8192)
	for i, d := range []*daemon{b, c} {
		writeTensor(t, d.path("dst"), fill(8192, byte(10+i)))
		require.NoError(t, os.Mkdir(d.path("tree"), 0o755))
		zeros(t, d.path("tree", "w"), 300)
	}
	for _, dir := range []string{a.path("tree"), a.path("tree2")} {
		require.NoError(t, os.MkdirAll(dir, 0o755))
	}
	writeTensor(t, a.path("tree", "w"), fill(300, 7))
	writeTensor(t, a.path("tree", "x"), fill(11, 8))
	zeros(t, a.path("tree2", "w"), 300)
	zeros(t, a.path("tree2", "x"), 11)
	zeros(t, b.path("tree", "x"), 11) // c's tree has no x: its tree @0 is refused
	return snapMounts(a, b, c)
}

// snapMounts reads every file of the daemons' mounts, by path: a call
// refused for its lines leaves the same snapshot.
func snapMounts(ds ...*daemon) func() map[string][]byte {
	return func() map[string][]byte {
		m := map[string][]byte{}
		for _, d := range ds {
			filepath.Walk(d.mnt, func(p string, fi os.FileInfo, err error) error {
				if err == nil && !fi.IsDir() {
					data, _ := os.ReadFile(p)
					m[p] = data
				}
				return nil
			})
		}
		return m
	}
}

// TestInPlaceRefusalsSeveralPeers: a call whose in-place lines are
// several transfers (two peers' pushes, a pull and a push, two pulls, two
// trees) and one of them refused writes nothing anywhere: each transfer is
// checked before any runs. The same lines, all good, write everything.
func TestInPlaceRefusalsSeveralPeers(t *testing.T) {
	ds := cluster(t, []string{"a", "b", "c"})
	a, b, c := ds["a"], ds["b"], ds["c"]
	snap := severalPeers(t, a, b, c)
	before := snap()
	for _, tc := range []struct {
		on, attr, v string
		want        syscall.Errno
	}{
		// Two peers' pushes, the second refused.
		{a.path("src"), xattrs.CopyTo, "@0+4096 b:/dst@0\n@0+4096 c:/dst@5000", syscall.EINVAL},
		{a.path("src"), xattrs.CopyTo, "@0+4096 b:/dst@0\n@0+4096 c:/missing@0", syscall.ENOENT},
		{a.mnt, xattrs.Batch, "/src b:/dst@0\n/src c:/dst@5000", syscall.EINVAL},
		// The refused peer's in-place lines travel with its whole-tensor
		// line, after the other peer's in-place lines.
		{a.mnt, xattrs.Batch, "/src c:/dst@0\n/src b:/dst@5000\n/src b:/note", syscall.EINVAL},
		// These lines into this mount and two peers.
		{a.mnt, xattrs.Batch, "/src /loc@0\n/src b:/dst@0\n/src c:/dst@5000", syscall.EINVAL},
		// Two pulls (range lists), the second's source range past its end.
		{a.mnt, xattrs.Batch, "b:/dst@0+4096 /loc@0\nc:/dst@8000+4096 /loc@4096", syscall.EINVAL},
		{a.mnt, xattrs.Batch, "b:/dst@0+4096 /loc@0\nc:/missing@0+10 /loc@4096", syscall.ENOENT},
		// A pull whose destination range here is refused after a pull.
		{a.mnt, xattrs.Batch, "b:/dst@0+4096 /loc@0\nc:/dst@0+4096 /loc@6000", syscall.EINVAL},
		// A pull, then a push that the peer refuses.
		{a.mnt, xattrs.Batch, "b:/dst@0+4096 /loc@0\n/src c:/dst@5000", syscall.EINVAL},
		// A pull of a whole source in place, then a refused push.
		{a.mnt, xattrs.Batch, "b:/dst /loc@0\n/src c:/dst@5000", syscall.EINVAL},
		// copy_from of two peers' ranges, the second refused.
		{a.path("loc"), xattrs.CopyFrom, "b:/dst@1+4096 @0\nc:/dst@8000+4096 @4096", syscall.EINVAL},
		{a.path("loc"), xattrs.CopyFrom, "b:/dst@2+4096 @0\nc:/dst@0+4096 @6000", syscall.EINVAL},
		{a.path("loc"), xattrs.CopyFrom, "b:/dst@3+4096 @0\nzz:/dst@0+10 @4096", syscall.ENOENT},
		{a.path("loc"), xattrs.CopyFrom, "b:/dst@3+4096 @0\nzz:/x", syscall.ENOENT},     // an unknown peer's whole tensor
		{a.path("loc"), xattrs.CopyFrom, "b:/dst@4 @4\nc:/dst@0 @4096", syscall.EINVAL}, // whole sources: 8192 bytes do not fit at 4096
		// Two trees in place, the second with a tensor the first lacks.
		{a.path("tree"), xattrs.CopyTo, "b:/tree@0\nc:/tree@0", syscall.ENOENT},
		// A tree into this mount in place, then a peer's line refused.
		{a.mnt, xattrs.Batch, "/tree /tree2@0\n/src b:/dst@5000", syscall.EINVAL},
		// A whole-tensor line's parent must exist on its peer, as a copy
		// of its own's must (the lines go as one tree rooted at "/":
		// missing directories were made); a peer's root is a directory.
		{a.mnt, xattrs.Batch, "/src b:/nodir/x", syscall.ENOENT},
		{a.path("src"), xattrs.CopyTo, "b:/nodir/x\nc:/nodir/y", syscall.ENOENT},
		{a.path("src"), xattrs.CopyTo, "b:/dst/x\nc:/y", syscall.ENOTDIR},
		{a.mnt, xattrs.Batch, "/src c:/", syscall.EISDIR},
		{a.path("src"), xattrs.CopyTo, "@0+10 b:/dst@0\n@0+10 c:/", syscall.EISDIR},
		// Refused by this node's own checks, as they would be alone
		// (EINVAL, not the peer's EPROTO for a broken request).
		{a.mnt, xattrs.Batch, "/src b:/dst@0\n/src@0+1 c:/dst@9223372036854775807", syscall.EINVAL},
		{a.mnt, xattrs.Batch, "b:/dst@0+10 /loc@4000\n/src@0+1 c:/dst@9223372036854775807", syscall.EINVAL},
	} {
		err := unix.Setxattr(tc.on, tc.attr, []byte(tc.v), 0)
		require.ErrorIs(t, err, tc.want, "%s %q", tc.attr, tc.v)
		require.Equal(t, before, snap(), "%s %q wrote something", tc.attr, tc.v)
	}
	for _, d := range []*daemon{a, b, c} {
		require.Zero(t, d.stats().Live.Pins)
	}
	// The same kinds of call, every line good: every byte lands.
	regB, regC := ids(t, b.path("dst")), ids(t, c.path("dst"))
	setx(t, a.path("src"), xattrs.CopyTo, "@0+4096 b:/dst@0\n@0+100 c:/dst@4000")
	want := func(i, at, n int) []byte {
		w := fill(8192, byte(10+i))
		copy(w[at:], fill(4096, 2)[:n])
		return w
	}
	requireContent(t, b.path("dst"), want(0, 0, 4096))
	requireContent(t, c.path("dst"), want(1, 4000, 100))
	setx(t, a.path("loc"), xattrs.CopyFrom, "b:/dst@0+4096 @0\nc:/dst@4000+100 @4096")
	wantLoc := make([]byte, 8192)
	copy(wantLoc, fill(4096, 2))
	copy(wantLoc[4096:], fill(4096, 2)[:100])
	requireContent(t, a.path("loc"), wantLoc)
	require.Equal(t, regB, ids(t, b.path("dst")))
	require.Equal(t, regC, ids(t, c.path("dst")))
	for _, d := range []*daemon{a, b, c} {
		require.Zero(t, d.stats().Live.Pins)
	}
}

// TestInPlaceOverlapsRace: in-place copies into one range at once, from
// two peers over TCP (each chunk with its checksum), all succeed, and every byte of the
// range is one of theirs: overlapping in-place copies race byte by byte
// (DESIGN.md), they do not fail. The receiver summed a chunk it had read
// in place from the destination's memory, which the other copy could
// already have overwritten: 72 of 600 such copies failed with EIO
// ("checksum mismatch"), found by a breaker helper (2026-12-06).
func TestInPlaceOverlapsRace(t *testing.T) {
	ds := cluster(t, []string{"a", "b", "c"})
	a, b, c := ds["a"], ds["b"], ds["c"]
	const n = 1 << 20
	srcs := map[*daemon][]byte{a: fill(n, 21), c: fill(n, 22)}
	for d, data := range srcs {
		writeTensor(t, d.path("src"), data)
	}
	zeros(t, b.path("d"), n+4096)
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for d := range srcs {
		wg.Go(func() {
			for range 60 {
				if err := unix.Setxattr(d.path("src"), xattrs.CopyTo, []byte("b:/d@1000"), 0); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("copy: %v", err)
	}
	got, err := os.ReadFile(b.path("d"))
	require.NoError(t, err)
	for i := range n {
		if v := got[1000+i]; v != srcs[a][i] && v != srcs[c][i] {
			t.Fatalf("byte %d of the range is %d: neither copy's", i, v)
		}
	}
	for _, d := range []*daemon{a, b, c} {
		require.Zero(t, d.stats().Live.Pins)
	}
}

// pushWhilePinned starts copy_to of a's tensor big with value (an in-place
// line into receiver r), and returns once r pins the destination for it or
// the copy has already ended (its result, buffered, is in the channel: the
// case is then the sequential one, and logged).
func pushWhilePinned(t *testing.T, a, r *daemon, value string) chan error {
	t.Helper()
	return setWhilePinned(t, a.path("big"), xattrs.CopyTo, value, r)
}

// setWhilePinned sets attr of f to value in the background (a copy) and
// returns once pinned (a daemon whose pins it watches) holds a pin, or the
// copy ended; the copy's result comes on the channel.
func setWhilePinned(t *testing.T, f, attr, value string, pinned *daemon) chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- unix.Setxattr(f, attr, []byte(value), 0) }()
	require.Eventually(t, func() bool { return pinned.stats().Live.Pins > 0 || len(done) > 0 }, 10*time.Second, time.Millisecond)
	if len(done) > 0 {
		t.Log("the copy ended before its pin was seen")
	}
	return done
}

// endsWithinTimeout waits for a copy whose peer was just killed: it must
// end (with its error, or done before the kill) within the daemons'
// --timeout (3 s) and some slack.
func endsWithinTimeout(t *testing.T, done chan error) {
	t.Helper()
	start := time.Now()
	select {
	case err := <-done:
		if err == nil {
			t.Log("the copy ended before the kill")
		}
	case <-time.After(3*time.Second + 5*time.Second):
		t.Fatal("no error within the timeout")
	}
	t.Logf("error %v after the kill", time.Since(start))
}

// bigSource makes a's tensor big of n zero bytes.
func bigSource(t *testing.T, a *daemon, n int64) {
	t.Helper()
	require.NoError(t, os.WriteFile(a.path("big"), nil, 0o644))
	require.NoError(t, os.Truncate(a.path("big"), n))
}

// TestInPlaceTruncateWaits: a truncate of an in-place copy's destination
// waits for the copy (its memory and size stay until the bytes have
// landed); an unlink takes the name at once and the memory goes after.
func TestInPlaceTruncateWaits(t *testing.T) {
	onPaths(t, false, func(t *testing.T, a, b *daemon, _ string) { inPlaceTruncateWaits(t, a, b) })
}

func inPlaceTruncateWaits(t *testing.T, a, b *daemon) {
	const n = 128 << 20
	bigSource(t, a, n)
	zeros(t, b.path("dst"), n)
	done := pushWhilePinned(t, a, b, "b:/dst@0")
	require.NoError(t, os.Truncate(b.path("dst"), 4096), "the truncate waits, then succeeds")
	select {
	case err := <-done:
		require.NoError(t, err, "the copy's range stayed inside the tensor")
	case <-time.After(time.Second):
		t.Fatal("the truncate returned before the copy")
	}
	// An unlink during a copy: the copy completes into memory that stays
	// alive until it ends, then everything is freed.
	zeros(t, b.path("dst2"), n)
	done = pushWhilePinned(t, a, b, "b:/dst2@0")
	require.NoError(t, os.Remove(b.path("dst2")))
	require.NoError(t, <-done)
	os.Remove(b.path("dst"))
	os.Remove(a.path("big"))
	b.requireClean()
	a.requireClean()
}

// TestInPlacePeerKilled: the receiver killed during an in-place copy: the
// sender's error comes within its --timeout, and its pins are back to 0;
// the sender killed during one: the receiver's pin on its destination ends
// within its --timeout, and the destination keeps its registration.
func TestInPlacePeerKilled(t *testing.T) {
	for _, p := range copyPaths(false) {
		t.Run(p.name, func(t *testing.T) { inPlacePeerKilled(t, p) })
	}
}

func inPlacePeerKilled(t *testing.T, p copyPath) {
	a, b := pairOn(t, p)
	skipIfKillAborts(t, a, b, "b")
	const n = 256 << 20
	bigSource(t, a, n)
	zeros(t, b.path("dst"), n)
	done := pushWhilePinned(t, a, b, "b:/dst@0")
	b.kill()
	endsWithinTimeout(t, done)
	require.Eventually(t, func() bool { return a.stats().Live.Pins == 0 }, 5*time.Second, 10*time.Millisecond)
	os.Remove(a.path("big"))
	a.requireClean()

	// The other way: a pushes into c, and a dies.
	ds := cluster(t, []string{"a2", "c"}, p.flags(t)...)
	a2, c := ds["a2"], ds["c"]
	bigSource(t, a2, n)
	zeros(t, c.path("dst"), n)
	reg := ids(t, c.path("dst"))
	done = pushWhilePinned(t, a2, c, "c:/dst@0")
	a2.kill()
	<-done
	require.Eventually(t, func() bool { return c.stats().Live.Pins == 0 }, 3*time.Second+5*time.Second, 10*time.Millisecond,
		"the receiver's pin ends within its timeout")
	require.Equal(t, reg, ids(t, c.path("dst")))
	afterKill(t, c, a2, "c", p.path == "ucx")
	require.NoError(t, os.Remove(c.path("dst")))
	c.requireClean()
}

// skipIfKillAborts skips a peer-kill test whose pair a, b (b named bName
// at a) copies on a UCX endpoint (--ucx-any-endpoint) where UCX aborts
// the survivor: one that is one-sided but cannot detect a dead peer (UCX
// 1.19's cma over shared memory: a process_vm_readv of the dead peer is
// fatal, cma_ep.c; seen), or one whose gets are emulated and that
// detects peer failure (UCX's tcp: the source serving the gets of a dead
// destination aborts, ucp_rma_sw_send_cmpl -> ucs_fatal; seen in CI).
// UCX 1.13's shared memory emulates without detecting, and the test runs.
// A small copy first makes the endpoints.
func skipIfKillAborts(t *testing.T, a, b *daemon, bName string) {
	t.Helper()
	if !a.hasUCX() {
		return
	}
	writeTensor(t, a.path("hello"), fill(4096, 1))
	setx(t, a.path("hello"), xattrs.CopyTo, bName+":/hello")
	require.NoError(t, os.Remove(a.path("hello")))
	require.NoError(t, os.Remove(b.path("hello")))
	p := a.stats().Peers[bName]
	switch {
	case !p.UCXCarries:
	case p.UCXOneSided && !p.UCXPeerFailure:
		t.Skipf("this UCX moves the bytes one-sided on an endpoint that cannot detect a dead peer (%v): a peer killed mid-copy aborts the survivor (UCX's cma: process_vm_readv of a dead pid is fatal without peer error handling); tensorfs uses such an endpoint only with --ucx-any-endpoint", p.UCX)
	case !p.UCXOneSided && p.UCXPeerFailure:
		t.Skipf("this UCX emulates the gets on an endpoint that detects a dead peer (%v): a source whose destination dies mid-copy aborts (ucp_rma_sw_send_cmpl -> ucs_fatal); tensorfs uses such an endpoint only with --ucx-any-endpoint", p.UCX)
	}
}

// afterKill checks the survivor of a peer killed mid-copy, once the
// killed one is started again on its mountpoint: the survivor idles (no
// core spun on the dead peer: UCX's worker once stayed busy for ever on
// an endpoint to it, its event fd ready for ever), and copies both ways
// between them (the survivor named survivorName) work within the timeout.
//
// Over UCX's shared memory (unguarded: ucx-sm, --ucx-any-endpoint),
// that last part is logged, not required: with UCX 1.13 a get stopped by
// its peer's death stays queued in the worker behind the dead peer (the
// emulation needs the peer's worker to answer, shared memory cannot fail
// it, nor an endpoint without peer failure detection be closed by
// force), and a later get on the same worker then times out (ETIMEDOUT)
// until the survivor restarts: seen under load (the tagged suite with
// -race), not alone. A limit of an unguarded endpoint, which tensorfs
// uses only when told to; an RDMA endpoint detects a dead peer and is
// closed by force.
func afterKill(t *testing.T, survivor, killed *daemon, survivorName string, unguarded bool) {
	t.Helper()
	// A get stopped by the kill is drained for up to 2 s first.
	time.Sleep(2 * time.Second)
	require.Less(t, survivor.cpu(time.Second), 300*time.Millisecond, "the survivor idles")
	again := killed.relaunch()
	data := fill(1<<20, 7)
	writeTensor(t, again.path("x"), data)
	writeTensor(t, again.path("y"), nil)
	start := time.Now()
	err := unix.Setxattr(again.path("x"), xattrs.CopyTo, []byte(survivorName+":/x"), 0)
	if err == nil {
		err = unix.Setxattr(again.path("y"), xattrs.CopyFrom, []byte(survivorName+":/x"), 0)
	}
	switch {
	case unguarded && err != nil:
		t.Logf("KNOWN (issue 17, --ucx-any-endpoint): a copy with the restarted peer over UCX's shared memory failed after %v: %v", time.Since(start), err)
	default:
		require.NoError(t, err, "copies with the restarted peer")
		requireContent(t, survivor.path("x"), data)
		requireContent(t, again.path("y"), data)
		require.Less(t, time.Since(start), 3*time.Second, "copies with the restarted peer")
	}
	require.Less(t, survivor.cpu(time.Second), 300*time.Millisecond, "the survivor idles")
	os.Remove(survivor.path("x"))
}

// TestInPlacePullManyTensors: a call whose lines pull ranges from several
// of a peer's tensors into several tensors here (a KV cache of a layer per
// tensor, the blocks of every layer of one request) is one transfer, on
// the IPC path and over TCP: one range-list get for the peer, through
// batch on the root and copy_from on a file. One bad list (a missing
// tensor there, a range outside a tensor there or here) fails the call
// before a byte of any list moves.
func TestInPlacePullManyTensors(t *testing.T) {
	onBothPaths(t, func(t *testing.T, a, b *daemon, path string) {
		const blk, n, layers = 4096, 16, 4
		require.NoError(t, os.Mkdir(b.path("kv"), 0o755))
		require.NoError(t, os.Mkdir(a.path("cache"), 0o755))
		srcs := make([][]byte, layers)
		wants := make([][]byte, layers)
		var before [layers][3]string
		for l := range layers {
			srcs[l] = fill(n*blk, byte(10+l))
			writeTensor(t, b.path(fmt.Sprintf("kv/l%d", l)), srcs[l])
			zeros(t, a.path(fmt.Sprintf("cache/l%d", l)), 2*n*blk)
			before[l] = ids(t, a.path(fmt.Sprintf("cache/l%d", l)))
			wants[l] = make([]byte, 2*n*blk)
		}
		// Every block of the request, layer by layer interleaved, into
		// shuffled blocks of each layer's cache.
		perm := rand.New(rand.NewSource(11)).Perm(2 * n)[:n]
		var lines []string
		for i, j := range perm {
			for l := range layers {
				lines = append(lines, fmt.Sprintf("b:/kv/l%d@%d+%d /cache/l%d@%d", l, i*blk, blk, l, j*blk))
				copy(wants[l][j*blk:], srcs[l][i*blk:(i+1)*blk])
			}
		}
		oneTransfer := func(recent int, bytes int64) {
			t.Helper()
			got := a.stats().Transfers.Recent[recent:]
			require.Len(t, got, 1, "one call, one transfer: %+v", got)
			require.Equal(t, "in_place", got[0].Mode, "%+v", got[0])
			require.Equal(t, bytes, got[0].BytesTotal, "%+v", got[0])
			require.Equal(t, path, got[0].Path, "%+v", got[0])
			require.Empty(t, got[0].Error)
		}
		recent := len(a.stats().Transfers.Recent)
		setx(t, a.mnt, xattrs.Batch, strings.Join(lines, "\n"))
		for l := range layers {
			p := a.path(fmt.Sprintf("cache/l%d", l))
			requireContent(t, p, wants[l])
			require.Equal(t, before[l], ids(t, p), "mr_id, ipc_id and generation are kept")
		}
		oneTransfer(recent, layers*n*blk)
		require.Contains(t, a.stats().Transfers.Recent[recent].Src, fmt.Sprintf("and %d more lists", layers-1))

		// copy_from on one file, from two of the peer's tensors: one
		// transfer too.
		recent = len(a.stats().Transfers.Recent)
		setx(t, a.path("cache/l0"), xattrs.CopyFrom, fmt.Sprintf("b:/kv/l1@0+%d @0\nb:/kv/l2@%d+%d @%d\nb:/kv/l1@%d+%d @%d", blk, blk, blk, blk, blk, blk, 2*blk))
		copy(wants[0], srcs[1][:blk])
		copy(wants[0][blk:], srcs[2][blk:2*blk])
		copy(wants[0][2*blk:], srcs[1][blk:2*blk])
		requireContent(t, a.path("cache/l0"), wants[0])
		oneTransfer(recent, 3*blk)

		// One bad list among good ones: the error, and not a byte
		// written into any tensor here.
		for _, bad := range []struct {
			line  string
			errno syscall.Errno
		}{
			{fmt.Sprintf("b:/kv/nope@0+%d /cache/l3@0", blk), syscall.ENOENT},
			{fmt.Sprintf("b:/kv/l3@%d+%d /cache/l3@0", n*blk, blk), syscall.EINVAL},
			{fmt.Sprintf("b:/kv/l3@0+%d /cache/l3@%d", blk, 2*n*blk), syscall.EINVAL},
			{fmt.Sprintf("b:/kv@0+%d /cache/l3@0", blk), syscall.EINVAL},
		} {
			v := fmt.Sprintf("b:/kv/l0@0+%d /cache/l0@%d\nb:/kv/l1@0+%d /cache/l1@0\n%s", blk, 5*blk, blk, bad.line)
			err := unix.Setxattr(a.mnt, xattrs.Batch, []byte(v), 0)
			require.ErrorIs(t, err, bad.errno, "%q", v)
			for l := range layers {
				requireContent(t, a.path(fmt.Sprintf("cache/l%d", l)), wants[l])
			}
		}
		for _, d := range []*daemon{a, b} {
			require.Zero(t, d.stats().Live.Pins)
		}
	})
}

// TestInPlacePullPeerKilled: the source killed during an in-place pull:
// the puller's error comes within its --timeout and its pin on the
// destination is back to 0, the destination keeping its registration;
// the puller killed during one: the source's tensor is released (a
// truncate of it, which waits for the copies reading it, returns within
// the source's --timeout).
func TestInPlacePullPeerKilled(t *testing.T) {
	for _, p := range copyPaths(false) {
		t.Run(p.name, func(t *testing.T) {
			const n = 256 << 20
			a, b := pairOn(t, p)
			skipIfKillAborts(t, a, b, "b")
			bigSource(t, b, n)
			zeros(t, a.path("dst"), n)
			reg := ids(t, a.path("dst"))
			done := setWhilePinned(t, a.path("dst"), xattrs.CopyFrom, "b:/big @0", a)
			b.kill()
			endsWithinTimeout(t, done)
			require.Eventually(t, func() bool { return a.stats().Live.Pins == 0 }, 5*time.Second, 10*time.Millisecond)
			require.Equal(t, reg, ids(t, a.path("dst")))
			afterKill(t, a, b, "a", p.path == "ucx")

			// The other way: a2 pulls from c, and a2 dies.
			ds := cluster(t, []string{"a2", "c"}, p.flags(t)...)
			a2, c := ds["a2"], ds["c"]
			bigSource(t, c, n)
			zeros(t, a2.path("dst"), n)
			done = setWhilePinned(t, a2.path("dst"), xattrs.CopyFrom, "c:/big @0", a2)
			a2.kill()
			<-done
			truncated := make(chan error, 1)
			go func() { truncated <- os.Truncate(c.path("big"), 4096) }()
			select {
			case err := <-truncated:
				require.NoError(t, err)
			case <-time.After(3*time.Second + 5*time.Second):
				t.Fatal("the source stayed frozen past its timeout after the puller died")
			}
			afterKill(t, c, a2, "c", p.path == "ucx")
			require.NoError(t, os.Remove(c.path("big")))
			c.requireClean()
		})
	}
}

// TestInPlaceScatter1000: the scatter benchmark's copy as a test, on every
// path: 1000 blocks of 8 KiB (8 MiB: over TCP, 256 KiB chunks of 32 blocks
// each on two streams) pushed into shuffled blocks of the peer's tensor,
// then pulled back into shuffled blocks of a local one. Every byte lands where its line says,
// a mapping made before the copies sees them, nothing else is touched and
// both tensors keep their registration.
func TestInPlaceScatter1000(t *testing.T) {
	onBothPaths(t, func(t *testing.T, a, b *daemon, path string) {
		const n, blk = 1000, 8 << 10
		src := fill(n*blk, 21)
		writeTensor(t, a.path("blocks"), src)
		zeros(t, b.path("cache"), 2*n*blk)
		zeros(t, a.path("back"), 2*n*blk)
		before := [2][3]string{ids(t, b.path("cache")), ids(t, a.path("back"))}
		m := mapTensor(t, b.path("cache"))
		r := rand.New(rand.NewSource(5))
		push, pull := r.Perm(2 * n)[:n], r.Perm(2 * n)[:n]
		want, wantBack := make([]byte, 2*n*blk), make([]byte, 2*n*blk)
		var lines, back []string
		for i, j := range push {
			lines = append(lines, fmt.Sprintf("@%d+%d b:/cache@%d", i*blk, blk, j*blk))
			copy(want[j*blk:], src[i*blk:(i+1)*blk])
		}
		for i, j := range pull {
			// Block i of the pull is what the push put at push[i].
			back = append(back, fmt.Sprintf("b:/cache@%d+%d @%d", push[i]*blk, blk, j*blk))
			copy(wantBack[j*blk:], src[i*blk:(i+1)*blk])
		}
		setx(t, a.path("blocks"), xattrs.CopyTo, strings.Join(lines, "\n"))
		require.True(t, bytes.Equal(want, m.mem), "the mapping made before the copy sees every block, and nothing else")
		setx(t, a.path("back"), xattrs.CopyFrom, strings.Join(back, "\n"))
		requireContent(t, b.path("cache"), want)
		requireContent(t, a.path("back"), wantBack)
		require.Equal(t, before, [2][3]string{ids(t, b.path("cache")), ids(t, a.path("back"))})
		st := a.stats()
		require.EqualValues(t, 2, ofPath(st.Copies.InPlace, path), "%+v", st.Copies)
		require.EqualValues(t, 2*n*blk, allPaths(st.Copies.Bytes), "%+v", st.Copies)
		m.close()
		for _, d := range []*daemon{a, b} {
			require.Zero(t, d.stats().Live.Pins)
		}
	})
}
