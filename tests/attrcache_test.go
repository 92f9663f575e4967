package tests

// The kernel caches a tensor file's attributes for a second (fs's
// attrTimeout): every change the daemon makes itself must reach it before
// anyone can look, so that stat right after any change shows it (the spec).
// A path's stat looks the name up again (entry timeout 0) and gets fresh
// attributes with it; an open file's statx asking only for size, blocks or
// nlink trusts the cache until it expires or is invalidated, so that is
// what these tests read.

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/internal/testutil"
	"github.com/tensorfs/tensorfs/xattrs"
)

// cachedStatx is statx on the open file f for size, blocks and nlink only:
// the kernel answers from its attribute cache while that is valid.
func cachedStatx(t *testing.T, f *os.File) unix.Statx_t {
	t.Helper()
	var st unix.Statx_t
	require.NoError(t, unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_SIZE|unix.STATX_BLOCKS|unix.STATX_NLINK, &st))
	return st
}

// TestAttrCacheInvalidated: each change of a file's size, blocks or nlink
// that the kernel does not make itself (an action on another node, or an
// xattr whose effect the kernel cannot know) is seen at once through a file
// opened and statted before it, within the attribute cache's second:
//   - a batch on the root replacing a file with a whole-tensor line (an
//     internal rename: the old file's nlink goes to 0);
//   - copy_from on a directory replacing a file of it with one of another
//     size (adoption, inside the directory's setxattr);
//   - copy_from on the file itself, of another size;
//   - shape on an unallocated file (it allocates);
//   - a reshape that keeps nbytes changes nothing (and stays cached).
func TestAttrCacheInvalidated(t *testing.T) {
	d := startDaemon(t)
	write := func(name string, n int) []byte {
		b := bytes.Repeat([]byte{byte(n)}, n)
		require.NoError(t, os.WriteFile(d.path(name), b, 0o644))
		return b
	}
	var opened []*os.File
	open := func(name string) *os.File {
		f, err := os.Open(d.path(name))
		require.NoError(t, err)
		opened = append(opened, f)
		return f
	}

	t.Run("batch replaces a file", func(t *testing.T) {
		write("old", 4096)
		src := write("new", 8192)
		f := open("old")
		st := cachedStatx(t, f)
		require.EqualValues(t, 4096, st.Size)
		require.EqualValues(t, 1, st.Nlink)
		setx(t, d.mnt, xattrs.Batch, "/new /old")
		st = cachedStatx(t, f)
		require.EqualValues(t, 0, st.Nlink, "the replaced file's nlink, through its open handle")
		require.EqualValues(t, 4096, st.Size)
		g := open("old")
		require.EqualValues(t, 8192, cachedStatx(t, g).Size)
		got, err := os.ReadFile(d.path("old"))
		require.NoError(t, err)
		require.Equal(t, src, got)
	})

	t.Run("copy_from on a directory adopts", func(t *testing.T) {
		require.NoError(t, os.MkdirAll(d.path("from"), 0o755))
		require.NoError(t, os.MkdirAll(d.path("into"), 0o755))
		write("from/x", 12288)
		write("into/x", 4096)
		f := open("into/x")
		require.EqualValues(t, 4096, cachedStatx(t, f).Size)
		setx(t, d.path("into"), xattrs.CopyFrom, "/from")
		st := cachedStatx(t, f)
		require.EqualValues(t, 12288, st.Size, "the adopting file's size, through its open handle")
		require.EqualValues(t, 1, st.Nlink)
	})

	t.Run("copy_from on the file", func(t *testing.T) {
		write("big", 20480)
		write("small", 4096)
		f := open("small")
		require.EqualValues(t, 4096, cachedStatx(t, f).Size)
		setx(t, d.path("small"), xattrs.CopyFrom, "/big")
		require.EqualValues(t, 20480, cachedStatx(t, f).Size)
	})

	t.Run("shape allocates", func(t *testing.T) {
		require.NoError(t, os.WriteFile(d.path("empty"), nil, 0o644))
		f := open("empty")
		st := cachedStatx(t, f)
		require.EqualValues(t, 0, st.Size)
		require.EqualValues(t, 0, st.Blocks)
		setx(t, d.path("empty"), xattrs.DType, "F32")
		setx(t, d.path("empty"), xattrs.Shape, "16,64")
		st = cachedStatx(t, f)
		require.EqualValues(t, 4096, st.Size)
		require.NotZero(t, st.Blocks)
		// A reshape keeps nbytes: nothing to tell, and nothing wrong.
		setx(t, d.path("empty"), xattrs.Shape, "64,16")
		require.EqualValues(t, 4096, cachedStatx(t, f).Size)
	})

	t.Run("many changes in a row", func(t *testing.T) {
		// No invalidation is lost to a GETATTR answered in between: each
		// size is seen right after its change.
		write("seq", 1)
		f := open("seq")
		for i := 2; i <= 40; i++ {
			require.NoError(t, os.WriteFile(d.path(fmt.Sprint("src", i)), bytes.Repeat([]byte{1}, 512*i), 0o644))
			setx(t, d.path("seq"), xattrs.CopyFrom, fmt.Sprint("/src", i))
			require.EqualValues(t, 512*i, cachedStatx(t, f).Size, "copy %d", i)
		}
	})
	for _, f := range opened {
		require.NoError(t, f.Close())
	}
	d.removeAll()
	d.requireClean()
}

// TestAttrCacheRequests: what the cache saves. With default_permissions the
// kernel checks the mode before every setxattr; with cached attributes a
// setxattr on a path is a LOOKUP and the SETXATTR (it was a GETATTR too),
// and one on an open fd the SETXATTR alone. The first reply naming a file
// the kernel does not hold yet caches nothing (fs kernelHeld): one GETATTR
// then, none after. Counted by the daemon's FUSE request metrics.
func TestAttrCacheRequests(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	d := startDaemon(t, "--metrics", addr)
	d.requireLog("metrics: serving http://" + addr + "/metrics")
	p := d.path("t")
	require.NoError(t, os.WriteFile(p, make([]byte, 4096), 0o644))
	ops := func() (lookup, getattr, setxattr float64) {
		s := scrapeMetrics(t, addr)
		return s.value("tensorfs_fuse_requests_total", "op", "lookup"),
			s.value("tensorfs_fuse_requests_total", "op", "getattr"),
			s.value("tensorfs_fuse_requests_total", "op", "setxattr")
	}
	const n = 200
	l0, g0, s0 := ops()
	for i := range n {
		require.NoError(t, unix.Setxattr(p, "user.n", []byte(fmt.Sprint(i)), 0))
	}
	l1, g1, s1 := ops()
	require.EqualValues(t, n, s1-s0)
	require.GreaterOrEqual(t, l1-l0, float64(n), "entries are not cached: a LOOKUP a path")
	require.LessOrEqual(t, g1-g0, 2.0, "GETATTRs for %d setxattrs on a path", n)

	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	for i := range n {
		require.NoError(t, unix.Fsetxattr(int(f.Fd()), "user.n", []byte(fmt.Sprint(i)), 0))
	}
	l2, g2, s2 := ops()
	require.EqualValues(t, n, s2-s1)
	require.LessOrEqual(t, l2-l1, 2.0, "LOOKUPs for %d setxattrs on an fd", n)
	require.LessOrEqual(t, g2-g1, 2.0, "GETATTRs for %d setxattrs on an fd", n)
}
