package tests

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// requireErrnoNoChange runs op, requires errno, and requires that the file's
// tensorfs attributes and content are exactly as before.
func requireErrnoNoChange(t *testing.T, path string, want syscall.Errno, what string, op func() error) {
	t.Helper()
	before := snapshot(t, path)
	require.ErrorIs(t, op(), want, what)
	require.Equal(t, before, snapshot(t, path), "%s changed something", what)
}

// snapshot is a node's readable tensorfs attributes, size and, for files,
// content.
func snapshot(t *testing.T, path string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, n := range listx(t, path) {
		if n != xattrs.StatsName {
			m[n] = getx(t, path, n)
		}
	}
	st, err := os.Stat(path)
	require.NoError(t, err)
	if !st.IsDir() {
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		m["content"] = string(data)
	}
	return m
}

func TestBadInput(t *testing.T) {
	d := startDaemon(t, "--max-memory", "64MiB")
	dir := d.path("kv")
	mkTemplateDir(t, dir, "F32", "4,4")
	p := dir + "/t"
	require.NoError(t, os.WriteFile(p, nil, 0o644))
	_, err := (func() (int, error) {
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		return f.WriteAt(bytes.Repeat([]byte{5}, 64), 0)
	})()
	require.NoError(t, err)
	empty := d.path("empty")
	require.NoError(t, os.WriteFile(empty, nil, 0o644))
	set := func(path, name, val string) func() error {
		return func() error { return unix.Setxattr(path, name, []byte(val), 0) }
	}

	for _, bad := range []string{"F31", "", "float33", "i3", "F32\n\nx", strings.Repeat("F", 300)} {
		requireErrnoNoChange(t, p, syscall.EINVAL, "dtype "+bad, set(p, xattrs.DType, bad))
		requireErrnoNoChange(t, dir, syscall.EINVAL, "dir dtype "+bad, set(dir, xattrs.DType, bad))
		requireErrnoNoChange(t, empty, syscall.EINVAL, "empty dtype "+bad, set(empty, xattrs.DType, bad))
	}
	for _, bad := range []string{"a", "2,,2", "-4", "4x4", "1.5", "[4,4", "99999999999999999999"} {
		requireErrnoNoChange(t, p, syscall.EINVAL, "shape "+bad, set(p, xattrs.Shape, bad))
		requireErrnoNoChange(t, dir, syscall.EINVAL, "dir shape "+bad, set(dir, xattrs.Shape, bad))
		requireErrnoNoChange(t, empty, syscall.EINVAL, "empty shape "+bad, set(empty, xattrs.Shape, bad))
	}
	// A shape that disagrees with nbytes, a dtype that cannot keep them.
	requireErrnoNoChange(t, p, syscall.EINVAL, "reshape 3,3", set(p, xattrs.Shape, "3,3"))
	three := d.path("three")
	require.NoError(t, os.WriteFile(three, []byte("abc"), 0o644))
	requireErrnoNoChange(t, three, syscall.EINVAL, "F32 over 3 bytes", set(three, xattrs.DType, "F32"))

	// Absurd sizes: past the largest tensor (EFBIG), past --max-memory (ENOSPC).
	requireErrnoNoChange(t, p, syscall.EFBIG, "truncate 1E", func() error { return os.Truncate(p, 1<<60) })
	requireErrnoNoChange(t, p, syscall.ENOSPC, "truncate 100G", func() error { return os.Truncate(p, 100<<30) })
	requireErrnoNoChange(t, p, syscall.EINVAL, "truncate -1", func() error { return syscall.Truncate(p, -1) })
	requireErrnoNoChange(t, empty, syscall.ENOSPC, "shape past max-memory", set(empty, xattrs.Shape, "1000000000"))
	requireErrnoNoChange(t, empty, syscall.EFBIG, "shape past the largest tensor", set(empty, xattrs.Shape, "1000000000,1000000000"))
	requireErrnoNoChange(t, dir, syscall.EFBIG, "template past the largest tensor", set(dir, xattrs.Shape, "1000000000,1000000000"))
	requireErrnoNoChange(t, p, syscall.ENOSPC, "write past max-memory", func() error {
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		require.NoError(t, err)
		defer f.Close()
		_, err = f.WriteAt([]byte{1}, 100<<20)
		return err
	})
	requireErrnoNoChange(t, p, syscall.ENOSPC, "fallocate past max-memory", func() error {
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		require.NoError(t, err)
		defer f.Close()
		return unix.Fallocate(int(f.Fd()), 0, 0, 100<<20)
	})
	requireErrnoNoChange(t, p, syscall.EOPNOTSUPP, "punch hole", func() error {
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		require.NoError(t, err)
		defer f.Close()
		return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4)
	})

	// A template whose tensors do not fit: create fails, and leaves no file.
	big := d.path("big")
	mkTemplateDir(t, big, "U8", "1000000000")
	_, err = os.Create(big + "/x")
	require.ErrorIs(t, err, syscall.ENOSPC)
	_, err = os.Stat(big + "/x")
	require.ErrorIs(t, err, syscall.ENOENT)

	// Names over 255 bytes.
	long := strings.Repeat("n", 256)
	_, err = os.Create(d.path(long))
	require.ErrorIs(t, err, syscall.ENAMETOOLONG)
	require.ErrorIs(t, os.Mkdir(d.path(long), 0o755), syscall.ENAMETOOLONG)
	require.ErrorIs(t, os.Rename(p, d.path(long)), syscall.ENAMETOOLONG)
	_, err = os.Stat(d.path(long))
	require.ErrorIs(t, err, syscall.ENAMETOOLONG)
	require.NoError(t, os.WriteFile(d.path(strings.Repeat("n", 255)), nil, 0o644), "255 bytes is fine")
	require.NoError(t, os.Remove(d.path(strings.Repeat("n", 255))))

	// device: EBUSY on an allocated tensor, EINVAL for a device not served.
	other := "cuda:0" // a device the tensor is not on (TENSORFS_TEST_DEVICE may put it on cuda:0)
	if getx(t, p, xattrs.Device) == "cuda:0" {
		other = "host"
	}
	requireErrnoNoChange(t, p, syscall.EBUSY, "device of allocated", set(p, xattrs.Device, other))
	requireErrnoNoChange(t, empty, syscall.EINVAL, "device cuda:7", set(empty, xattrs.Device, "cuda:7"))
	requireErrnoNoChange(t, empty, syscall.EINVAL, "device gpu", set(empty, xattrs.Device, "gpu"))
	requireErrnoNoChange(t, dir, syscall.EINVAL, "dir device cuda:x", set(dir, xattrs.Device, "cuda:x"))

	// Unknown names, read-only names, actions before they exist, wrong node kinds.
	requireErrnoNoChange(t, p, syscall.EINVAL, "unknown name", set(p, xattrs.Prefix+"colour", "red"))
	requireErrnoNoChange(t, dir, syscall.EINVAL, "unknown name on dir", set(dir, xattrs.Prefix+"colour", "red"))
	_, err = getxErr(p, xattrs.Prefix+"colour")
	require.ErrorIs(t, err, syscall.ENODATA)
	for _, ro := range []string{"mr_id", "ipc_id", "ipc_handle", "ipc_offset", "nbytes", "generation"} {
		requireErrnoNoChange(t, p, syscall.EPERM, "set "+ro, set(p, xattrs.Prefix+ro, "7"))
		requireErrnoNoChange(t, p, syscall.EPERM, "remove "+ro, func() error { return unix.Removexattr(p, xattrs.Prefix+ro) })
		_, err := getxErr(dir, xattrs.Prefix+ro)
		require.ErrorIs(t, err, syscall.ENODATA, "%s on a directory", ro)
	}
	requireErrnoNoChange(t, d.mnt, syscall.EPERM, "set stats", set(d.mnt, xattrs.StatsName, "{}"))
	requireErrnoNoChange(t, p, syscall.EPERM, "remove dtype of a file", func() error { return unix.Removexattr(p, xattrs.DType) })
	for _, a := range []string{"copy_to", "copy_from"} {
		requireErrnoNoChange(t, p, syscall.ENOENT, a+" to an unknown peer", set(p, xattrs.Prefix+a, "b:/x"))
		requireErrnoNoChange(t, dir, syscall.ENOENT, a+" on dir, unknown peer", set(dir, xattrs.Prefix+a, "b:/x"))
		for _, bad := range []string{"b:/../x", "b:x", ":/x", "/kv/../x", "relative", "b:/a//b", "/a/./b"} {
			requireErrnoNoChange(t, p, syscall.EINVAL, a+" "+bad, set(p, xattrs.Prefix+a, bad))
		}
	}
	requireErrnoNoChange(t, p, syscall.EINVAL, "register with a malformed handle", set(p, xattrs.Register, "memfd:/proc/1/fd/x"))
	requireErrnoNoChange(t, d.mnt, syscall.EINVAL, "batch with relative paths", set(d.mnt, xattrs.Batch, "a b"))
	requireErrnoNoChange(t, d.mnt, syscall.EINVAL, "batch with one field", set(d.mnt, xattrs.Batch, "/kv/t"))
	requireErrnoNoChange(t, dir, syscall.EINVAL, "batch on a subdirectory", set(dir, xattrs.Batch, "a b"))
	requireErrnoNoChange(t, p, syscall.EINVAL, "batch on a file", set(p, xattrs.Batch, "a b"))
	requireErrnoNoChange(t, dir, syscall.EINVAL, "register on a directory", set(dir, xattrs.Register, "x"))
	_, err = getxErr(dir, xattrs.StatsName)
	require.ErrorIs(t, err, syscall.ENODATA, "stats lives on the root only")
	_, err = getxErr(p, xattrs.CopyTo)
	require.ErrorIs(t, err, syscall.ENODATA, "actions are write-only")
	requireErrnoNoChange(t, p, syscall.EOPNOTSUPP, "trusted namespace", set(p, "trusted.x", "1"))
	requireErrnoNoChange(t, p, syscall.E2BIG, "user xattr over 64 KiB", set(p, "user.big", strings.Repeat("x", 65537)))

	// A short buffer gets ERANGE; a size probe the length.
	n, err := unix.Getxattr(p, xattrs.Shape, nil)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	_, err = unix.Getxattr(p, xattrs.Shape, make([]byte, 2))
	require.ErrorIs(t, err, syscall.ERANGE)
	_, err = unix.Listxattr(p, make([]byte, 4))
	require.ErrorIs(t, err, syscall.ERANGE)

	// No hard links, symlinks or device nodes.
	require.ErrorIs(t, os.Link(p, d.path("hard")), syscall.EPERM)
	require.ErrorIs(t, os.Symlink(p, d.path("sym")), syscall.EPERM)
	require.ErrorIs(t, syscall.Mkfifo(d.path("fifo"), 0o644), syscall.EPERM)
	require.ErrorIs(t, syscall.Mknod(d.path("dev"), syscall.S_IFCHR|0o644, 0x101), syscall.EPERM)

	// Directory template attributes can be removed; then files start empty.
	require.NoError(t, unix.Removexattr(dir, xattrs.Shape))
	require.ErrorIs(t, unix.Removexattr(dir, xattrs.Shape), syscall.ENODATA)
	require.NoError(t, os.WriteFile(dir+"/plain", nil, 0o644))
	require.Equal(t, "0", getx(t, dir+"/plain", xattrs.NBytes))

	require.NoError(t, os.RemoveAll(d.path("kv")))
	require.NoError(t, os.RemoveAll(big))
	require.NoError(t, os.Remove(empty))
	require.NoError(t, os.Remove(three))
	d.requireClean()
}

// TestRenameAndRmdirErrors: POSIX errnos for renames and rmdir.
func TestRenameAndRmdirErrors(t *testing.T) {
	d := startDaemon(t)
	require.NoError(t, os.Mkdir(d.path("d"), 0o755))
	require.NoError(t, os.WriteFile(d.path("d/f"), []byte("x"), 0o644))
	require.NoError(t, os.WriteFile(d.path("f"), []byte("y"), 0o644))
	require.NoError(t, os.Mkdir(d.path("e"), 0o755))
	require.ErrorIs(t, syscall.Rmdir(d.path("d")), syscall.ENOTEMPTY)
	require.ErrorIs(t, syscall.Rmdir(d.path("f")), syscall.ENOTDIR)
	require.ErrorIs(t, syscall.Unlink(d.path("d")), syscall.EISDIR)
	require.ErrorIs(t, syscall.Rename(d.path("f"), d.path("d")), syscall.EISDIR, "a file over a directory")
	require.ErrorIs(t, os.Rename(d.path("e"), d.path("f")), syscall.ENOTDIR)
	require.ErrorIs(t, unix.Renameat2(unix.AT_FDCWD, d.path("f"), unix.AT_FDCWD, d.path("d/f"), unix.RENAME_NOREPLACE), syscall.EEXIST)
	require.NoError(t, unix.Renameat2(unix.AT_FDCWD, d.path("f"), unix.AT_FDCWD, d.path("d/f"), unix.RENAME_EXCHANGE))
	data, err := os.ReadFile(d.path("f"))
	require.NoError(t, err)
	require.Equal(t, "x", string(data))
	require.NoError(t, os.Rename(d.path("e"), d.path("d/e")))
	require.NoError(t, os.RemoveAll(d.path("d")))
	require.NoError(t, os.Remove(d.path("f")))
	d.requireClean()
}

// TestMknodRegular: mknod(S_IFREG) creates a tensor file like create(2).
func TestMknodRegular(t *testing.T) {
	d := startDaemon(t)
	mkTemplateDir(t, d.path("kv"), "F16", "8")
	require.NoError(t, syscall.Mknod(d.path("kv/m"), syscall.S_IFREG|0o640, 0))
	st, err := os.Stat(d.path("kv/m"))
	require.NoError(t, err)
	require.EqualValues(t, 16, st.Size())
	require.Equal(t, os.FileMode(0o640), st.Mode().Perm())
	require.ErrorIs(t, syscall.Mknod(d.path("kv/m"), syscall.S_IFREG|0o640, 0), syscall.EEXIST)
	require.NoError(t, os.RemoveAll(d.path("kv")))
	d.requireClean()
}

// TestEmptyAfterKeepSizeFallocate: preallocating with KEEP_SIZE, then setting
// dtype and shape, sizes the tensor in its allocation (found by an
// adversarial run: the tensor was stuck with no shape).
func TestEmptyAfterKeepSizeFallocate(t *testing.T) {
	d := startDaemon(t)
	p := d.path("p")
	f, err := os.Create(p)
	require.NoError(t, err)
	require.NoError(t, unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, 0, 4096))
	require.NoError(t, f.Close())
	require.Equal(t, "0", getx(t, p, xattrs.NBytes))
	id := getx(t, p, xattrs.MRID)
	setx(t, p, xattrs.DType, "F32")
	setx(t, p, xattrs.Shape, "1024")
	require.Equal(t, "4096", getx(t, p, xattrs.NBytes))
	require.Equal(t, id, getx(t, p, xattrs.MRID), "it fits the preallocation")
	require.NoError(t, os.Remove(p))
	d.requireClean()
}

// TestDirFsyncAndStatx: fsync of a directory succeeds (atomic-save code does
// it after a rename) and statx is answered (go-fuse's default is ENOSYS,
// after which the kernel stops asking for the life of the mount).
func TestDirFsyncAndStatx(t *testing.T) {
	d := startDaemon(t)
	require.NoError(t, os.WriteFile(d.path("f"), []byte("12345"), 0o644))
	dir, err := os.Open(d.mnt)
	require.NoError(t, err)
	require.NoError(t, dir.Sync())
	require.NoError(t, dir.Close())
	var sx unix.Statx_t
	require.NoError(t, unix.Statx(unix.AT_FDCWD, d.path("f"), unix.AT_STATX_FORCE_SYNC, unix.STATX_BASIC_STATS, &sx))
	require.EqualValues(t, 5, sx.Size)
	require.EqualValues(t, 1, sx.Nlink)
	require.NotContains(t, d.log.String(), "function not implemented")
	require.NoError(t, os.Remove(d.path("f")))
	d.requireClean()
}

// TestDirNlink: a directory's nlink is 2 + its subdirectories, through
// mkdir, rename (in, out, over an empty directory, exchange) and rmdir.
func TestDirNlink(t *testing.T) {
	d := startDaemon(t)
	nlink := func(p string) uint64 {
		var st syscall.Stat_t
		require.NoError(t, syscall.Stat(p, &st))
		return uint64(st.Nlink)
	}
	for _, n := range []string{"p", "p/a", "p/b", "p/c", "q", "q/e"} {
		require.NoError(t, os.Mkdir(d.path(n), 0o755))
	}
	require.NoError(t, os.WriteFile(d.path("p/f"), nil, 0o644))
	require.EqualValues(t, 5, nlink(d.path("p")))
	require.NoError(t, os.Rename(d.path("p/a"), d.path("q/a")))
	require.EqualValues(t, 4, nlink(d.path("p")))
	require.EqualValues(t, 4, nlink(d.path("q")))
	require.NoError(t, syscall.Rename(d.path("p/b"), d.path("q/e"))) // over an empty dir (os.Rename refuses)
	require.EqualValues(t, 3, nlink(d.path("p")))
	require.EqualValues(t, 4, nlink(d.path("q")))
	require.NoError(t, unix.Renameat2(unix.AT_FDCWD, d.path("p/f"), unix.AT_FDCWD, d.path("q/a"), unix.RENAME_EXCHANGE))
	require.EqualValues(t, 4, nlink(d.path("p")), "p/f is now a directory")
	require.EqualValues(t, 3, nlink(d.path("q")))
	require.NoError(t, os.RemoveAll(d.path("p")))
	require.NoError(t, os.RemoveAll(d.path("q")))
	require.EqualValues(t, 2, nlink(d.mnt))
	d.requireClean()
}

// TestRefusalReasons: each refused attribute set or action a new user hit
// (a wrong dtype, a misspelled attribute, a device that is not there, a
// copy onto itself, a directory into its own subtree, a batch line whose
// source is missing) answers its errno, logs one line with the path, the
// attribute and why, and is listed in stats' errors.recent with the
// caller's thread id, so that a client can print the reason.
func TestRefusalReasons(t *testing.T) {
	d := startDaemon(t, "--device", "host")
	f := d.path("t")
	require.NoError(t, os.WriteFile(f, []byte("abcd"), 0o644))
	require.NoError(t, os.Mkdir(d.path("dir"), 0o755))
	for _, c := range []struct {
		path, rel, attr, val string
		errno                syscall.Errno
		reason               string
	}{
		{f, "/t", xattrs.DType, "float33", syscall.EINVAL, `float33`},
		{f, "/t", xattrs.Prefix + "dtpye", "F32", syscall.EINVAL, "unknown attribute user.tensorfs.dtpye"},
		{f, "/t", xattrs.NBytes, "8", syscall.EPERM, "is read-only"},
		{d.path("dir"), "/dir", xattrs.Device, "cuda:7", syscall.EINVAL, "cuda:7"},
		{f, "/t", xattrs.CopyTo, "/t", syscall.EINVAL, "onto itself"},
		{d.path("dir"), "/dir", xattrs.CopyTo, "/dir/sub", syscall.EINVAL, "own subtree"},
		{d.mnt, "/", xattrs.Batch, "/missing /t2", syscall.ENOENT, "missing"},
		{d.path("dir"), "/dir", xattrs.Batch, "/t /t2", syscall.EINVAL, "root directory only"},
	} {
		runtime.LockOSThread()
		tid := unix.Gettid()
		err := unix.Setxattr(c.path, c.attr, []byte(c.val), 0)
		runtime.UnlockOSThread()
		require.ErrorIs(t, err, c.errno, "%s=%q on %s", c.attr, c.val, c.rel)
		st := d.stats()
		r, ok := st.Refusal(uint32(tid), c.rel, c.attr)
		require.True(t, ok, "%s=%q on %s: no refusal in stats (thread %d): %+v", c.attr, c.val, c.rel, tid, st.Errors)
		require.Equal(t, unix.ErrnoName(c.errno), r.Errno)
		require.Contains(t, r.Reason, c.reason)
		require.WithinDuration(t, time.Now(), r.Time, time.Minute)
		d.requireLog("msg=refused attr=" + c.attr + " on=" + c.rel + " ")
		d.requireLog(c.reason)
	}
	st := d.stats()
	require.GreaterOrEqual(t, st.Errors.Total, int64(8))
	// The document ends with a newline (a terminal's prompt after getfattr
	// --only-values starts on its own line).
	raw := getx(t, d.mnt, xattrs.StatsName)
	require.True(t, strings.HasSuffix(raw, "\n"), "stats ends with a newline")
}

// TestStatsStaysReadable: refusals on a 4 KiB path fill the recent lists
// past what an xattr value may hold (64 KiB: reading stats failed with
// E2BIG, and tensorfs wait and status with it); the document drops its
// oldest entries instead and stays readable, the newest refusal kept.
func TestStatsStaysReadable(t *testing.T) {
	d := startDaemon(t, "--device", "host")
	dir := d.mnt
	for range 15 {
		dir = filepath.Join(dir, strings.Repeat("d", 250))
		require.NoError(t, os.Mkdir(dir, 0o755))
	}
	f := filepath.Join(dir, strings.Repeat("f", 200))
	require.NoError(t, os.WriteFile(f, []byte("abcd"), 0o644))
	for range 20 {
		require.ErrorIs(t, unix.Setxattr(f, xattrs.DType, []byte("bad"), 0), syscall.EINVAL)
		require.ErrorIs(t, unix.Setxattr(f, xattrs.CopyTo, []byte("nopeer:"+strings.TrimPrefix(f, d.mnt)), 0), syscall.ENOENT)
	}
	raw := getx(t, d.mnt, xattrs.StatsName)
	require.Less(t, len(raw), 64<<10)
	st := d.stats()
	require.EqualValues(t, 40, st.Errors.Total)
	require.NotEmpty(t, st.Errors.Recent, "the newest refusals are kept")
	last := st.Errors.Recent[len(st.Errors.Recent)-1]
	require.EqualValues(t, 40, last.ID)
	require.Equal(t, strings.TrimPrefix(f, d.mnt), last.Path)
	out, err := exec.Command(bin, "status", d.mnt).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NoError(t, os.RemoveAll(filepath.Join(d.mnt, strings.Repeat("d", 250))))
}
