package tests

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// TestTemplateCreate: a file created in a templated directory is allocated and
// registered at once, with every xattr of the spec; mkdir copies the template.
func TestTemplateCreate(t *testing.T) {
	d := startDaemon(t, "--device", "host") // checks memfd handles and exact bytes
	kv := d.path("kv")
	mkTemplateDir(t, kv, "bfloat16", "16,8,128")
	require.Equal(t, "BF16", getx(t, kv, xattrs.DType), "torch spelling stored canonically")

	f, err := os.Create(kv + "/b0")
	require.NoError(t, err)
	st, err := f.Stat()
	require.NoError(t, err)
	require.EqualValues(t, 16*8*128*2, st.Size())
	p := kv + "/b0"
	require.Equal(t, "BF16", getx(t, p, xattrs.DType))
	require.Equal(t, "16,8,128", getx(t, p, xattrs.Shape))
	require.Equal(t, "host", getx(t, p, xattrs.Device))
	require.Equal(t, "32768", getx(t, p, xattrs.NBytes))
	require.Equal(t, "0", getx(t, p, xattrs.Generation))
	require.Equal(t, "0", getx(t, p, xattrs.IPCOffset))
	mr1, err := strconv.ParseUint(getx(t, p, xattrs.MRID), 10, 64)
	require.NoError(t, err)
	_, err = strconv.ParseUint(getx(t, p, xattrs.IPCID), 10, 64)
	require.NoError(t, err)
	h := getx(t, p, xattrs.IPCHandle)
	require.True(t, strings.HasPrefix(h, "memfd:/proc/"), h)

	// The handle maps the same memory: a write through the file shows there.
	_, err = f.WriteAt([]byte("kvblock"), 64)
	require.NoError(t, err)
	mem, err := os.ReadFile(strings.TrimPrefix(h, "memfd:"))
	require.NoError(t, err)
	require.Equal(t, "kvblock", string(mem[64:71]))

	// listxattr shows what exists, including ordinary user attributes.
	setx(t, p, "user.model", "llama-3-8b")
	names := listx(t, p)
	for _, n := range []string{"dtype", "shape", "device", "nbytes", "generation", "mr_id", "ipc_id", "ipc_handle", "ipc_offset"} {
		require.Contains(t, names, xattrs.Prefix+n)
	}
	require.Contains(t, names, "user.model")
	require.Equal(t, "llama-3-8b", getx(t, p, "user.model"))

	// mkdir copies the template; a second file gets a new, never-reused id.
	require.NoError(t, os.Mkdir(kv+"/sub", 0o755))
	require.Equal(t, "16,8,128", getx(t, kv+"/sub", xattrs.Shape))
	require.NoError(t, os.WriteFile(kv+"/sub/b1", nil, 0o644))
	mr2, _ := strconv.ParseUint(getx(t, kv+"/sub/b1", xattrs.MRID), 10, 64)
	require.Greater(t, mr2, mr1)

	s := d.requireLeases(1, "the open file is a lease (b1's writer has closed)")
	require.EqualValues(t, 2, s.Live.Tensors)
	require.EqualValues(t, 2, s.Live.Regions)
	require.EqualValues(t, 2, s.Live.Exports)
	require.EqualValues(t, 2*32768, s.Live.Bytes)
	var sfs unix.Statfs_t
	require.NoError(t, unix.Statfs(d.mnt, &sfs))
	require.EqualValues(t, 2*32768, (sfs.Blocks-sfs.Bfree)*uint64(sfs.Bsize))

	require.NoError(t, f.Close())
	require.NoError(t, os.RemoveAll(kv))
	d.requireClean()
}

// TestFirstSizingAllocates: an untemplated file is empty and unregistered
// until truncate, fallocate, a write or a shape sizes it.
func TestFirstSizingAllocates(t *testing.T) {
	d := startDaemon(t)
	sizings := map[string]func(p string) error{
		"truncate": func(p string) error { return os.Truncate(p, 1000) },
		"fallocate": func(p string) error {
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			return unix.Fallocate(int(f.Fd()), 0, 0, 1000)
		},
		"write": func(p string) error { return os.WriteFile(p, make([]byte, 1000), 0) },
		"shape": func(p string) error { return unix.Setxattr(p, xattrs.Shape, []byte("1000"), 0) },
	}
	for name, size := range sizings {
		p := d.path(name)
		require.NoError(t, os.WriteFile(p, nil, 0o644))
		_, err := getxErr(p, xattrs.MRID)
		require.ErrorIs(t, err, syscall.ENODATA, "%s: no mr_id before sizing", name)
		require.Equal(t, "0", getx(t, p, xattrs.NBytes))
		require.NoError(t, size(p), name)
		st, err := os.Stat(p)
		require.NoError(t, err)
		require.EqualValues(t, 1000, st.Size(), name)
		require.Equal(t, "1000", getx(t, p, xattrs.NBytes), name)
		require.Equal(t, "U8", getx(t, p, xattrs.DType), name)
		require.Equal(t, "1000", getx(t, p, xattrs.Shape), name)
		getx(t, p, xattrs.MRID)
		require.NoError(t, os.Remove(p))
	}
	// dtype before shape: F32 [10, 4] is 160 bytes.
	p := d.path("f32")
	require.NoError(t, os.WriteFile(p, nil, 0o644))
	setx(t, p, xattrs.DType, "float32")
	setx(t, p, xattrs.Shape, "10,4")
	st, err := os.Stat(p)
	require.NoError(t, err)
	require.EqualValues(t, 160, st.Size(), "stat right after the xattr shows the new size")
	require.NoError(t, os.Remove(p))
	d.requireClean()
}

// TestResizeIDs: a size change that fits the allocation keeps the ids; one
// that does not re-registers, bumps generation and keeps the bytes; appends
// reallocate only O(log n) times.
func TestResizeIDs(t *testing.T) {
	d := startDaemon(t)
	p := d.path("t")
	require.NoError(t, os.WriteFile(p, []byte("0123456789"), 0o644))
	mr0 := getx(t, p, xattrs.MRID)
	ipc0 := getx(t, p, xattrs.IPCID)
	require.NoError(t, os.Truncate(p, 4))
	require.Equal(t, mr0, getx(t, p, xattrs.MRID))
	require.NoError(t, os.Truncate(p, 4096))
	require.NotEqual(t, mr0, getx(t, p, xattrs.MRID))
	require.NotEqual(t, ipc0, getx(t, p, xattrs.IPCID))
	require.Equal(t, "1", getx(t, p, xattrs.Generation))
	data, err := os.ReadFile(p)
	require.NoError(t, err)
	require.Equal(t, append([]byte("0123"), make([]byte, 4092)...), data, "kept bytes, zeros after")
	require.EqualValues(t, 1, d.stats().Live.Regions, "the old registration is gone")

	// 8 MiB appended in 64 KiB writes.
	f, err := os.OpenFile(d.path("log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	require.NoError(t, err)
	chunk := bytes.Repeat([]byte{0xab}, 64<<10)
	for i := 0; i < 128; i++ {
		_, err := f.Write(chunk)
		require.NoError(t, err)
	}
	require.NoError(t, f.Close())
	gen, _ := strconv.Atoi(getx(t, d.path("log"), xattrs.Generation))
	require.LessOrEqual(t, gen, 8, "appends must over-allocate geometrically")
	st, err := os.Stat(d.path("log"))
	require.NoError(t, err)
	require.EqualValues(t, 8<<20, st.Size())
	require.NoError(t, os.Remove(p))
	require.NoError(t, os.Remove(d.path("log")))
	d.requireClean()
}

// TestUnlinkWhileOpen: an unlinked tensor stays registered while a handle is
// open (fstat shows nlink 0) and is freed at the last close; rename over a
// tensor releases the old one the same way.
func TestUnlinkWhileOpen(t *testing.T) {
	d := startDaemon(t)
	mkTemplateDir(t, d.path("w"), "F32", "256")
	a, b := d.path("w/a"), d.path("w/b")
	require.NoError(t, os.WriteFile(a, nil, 0o644))
	require.NoError(t, os.WriteFile(b, nil, 0o644))
	f, err := os.OpenFile(a, os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("still here"), 0)
	require.NoError(t, err)
	require.NoError(t, os.Rename(b, a), "rename over a tensor that is open")
	require.EqualValues(t, 2, d.stats().Live.Tensors, "the replaced tensor lives while open")
	var st syscall.Stat_t
	require.NoError(t, syscall.Fstat(int(f.Fd()), &st))
	require.EqualValues(t, 0, st.Nlink)
	buf := make([]byte, 10)
	_, err = f.ReadAt(buf, 0)
	require.NoError(t, err)
	require.Equal(t, "still here", string(buf))
	require.NoError(t, f.Close())
	require.Eventually(t, func() bool { return d.stats().Live.Tensors == 1 }, 5e9, 1e7)
	require.NoError(t, os.Remove(a))
	require.NoError(t, os.Remove(d.path("w")))
	d.requireClean()
}

// TestStatfs: df shows the --max-memory cap as total and what tensorfs holds
// as used.
func TestStatfs(t *testing.T) {
	d := startDaemon(t, "--device", "host", "--max-memory", "64MiB") // exact byte accounting
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(d.mnt, &st))
	require.EqualValues(t, 64<<20, st.Blocks*uint64(st.Bsize))
	require.EqualValues(t, st.Blocks, st.Bfree)
	require.ErrorIs(t, os.Truncate(d.path("x"), 0), syscall.ENOENT)
	require.NoError(t, os.WriteFile(d.path("x"), nil, 0o644))
	require.NoError(t, os.Truncate(d.path("x"), 1<<20)) // an explicit size allocates exactly
	require.NoError(t, unix.Statfs(d.mnt, &st))
	require.EqualValues(t, 1<<20, (st.Blocks-st.Bfree)*uint64(st.Bsize))
	require.EqualValues(t, 255, st.Namelen)
	require.NoError(t, os.Remove(d.path("x")))
	d.requireClean()
}

// listx returns the names listxattr gives, probing the size first.
func listx(t *testing.T, path string) []string {
	t.Helper()
	n, err := unix.Listxattr(path, nil)
	require.NoError(t, err)
	buf := make([]byte, n)
	n, err = unix.Listxattr(path, buf)
	require.NoError(t, err)
	var names []string
	for _, s := range strings.Split(string(buf[:n]), "\x00") {
		if s != "" {
			names = append(names, s)
		}
	}
	return names
}

// TestMmap: a shared mapping of a tensor file sees pwrites, and its stores
// reach device memory (kernel direct-I/O mmap, Linux 6.6+).
func TestMmap(t *testing.T) {
	d := startDaemon(t)
	p := d.path("m")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(8192))
	_, err = f.WriteAt([]byte("hello"), 0)
	require.NoError(t, err)
	m, err := unix.Mmap(int(f.Fd()), 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if errors.Is(err, syscall.ENODEV) {
		var u unix.Utsname
		unix.Uname(&u)
		t.Skipf("kernel %s offers no direct-I/O mmap (needs 6.6+)", unix.ByteSliceToString(u.Release[:]))
	}
	require.NoError(t, err)
	require.Equal(t, "hello", string(m[:5]))
	copy(m[100:], "world")
	require.NoError(t, unix.Msync(m, unix.MS_SYNC))
	buf := make([]byte, 5)
	_, err = f.ReadAt(buf, 100)
	require.NoError(t, err)
	require.Equal(t, "world", string(buf))
	require.NoError(t, unix.Munmap(m))
	require.NoError(t, f.Close())
	require.NoError(t, os.Remove(p))
	d.requireClean()
}
