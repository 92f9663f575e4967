package tensor

import (
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/dtype"
	"github.com/tensorfs/tensorfs/gpu"
)

// ownedMemfd is memory another process owns: an unsealed memfd of size bytes
// holding byte(i) at i, and the owner's mapping of it.
func ownedMemfd(t *testing.T, size int) (handle string, fd int, mem []byte) {
	t.Helper()
	fd, err := unix.MemfdCreate("owner", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	require.NoError(t, unix.Ftruncate(fd, int64(size)))
	mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	for i := range mem {
		mem[i] = byte(i)
	}
	t.Cleanup(func() { unix.Munmap(mem); unix.Close(fd) })
	return fmt.Sprintf("memfd:/proc/%d/fd/%d", os.Getpid(), fd), fd, mem
}

func TestRegisterEmptyTensor(t *testing.T) {
	s := newStore(t, 64<<20)
	handle, _, mem := ownedMemfd(t, 8192)
	tn, err := s.New(Template{DType: "F32"})
	require.NoError(t, err)
	buf, err := s.Import(handle, 4096, 4096)
	require.NoError(t, err)
	require.NoError(t, tn.Register(buf))
	in := tn.Info()
	require.True(t, in.Allocated)
	require.True(t, tn.Registered())
	require.EqualValues(t, 4096, in.Size)
	require.Equal(t, dtype.DType("F32"), in.DType, "a dtype that divides the size is kept")
	require.Equal(t, dtype.Shape{1024}, in.Shape)
	require.EqualValues(t, 4096, in.IPCOffset)
	require.Zero(t, in.Generation)
	require.Equal(t, Stats{Tensors: 1, Regions: 1, Exports: 1}, s.Stats(), "registered memory is not counted in bytes")

	p := make([]byte, 4)
	_, err = tn.ReadAt(p, 0)
	require.NoError(t, err)
	require.Equal(t, mem[4096:4100], p)
	_, err = tn.WriteAt([]byte{9, 9}, 4094)
	require.NoError(t, err)
	require.Equal(t, []byte{9, 9}, mem[8190:8192])

	// Sizes are the owner's.
	require.ErrorIs(t, tn.Truncate(100), ErrForeign)
	require.ErrorIs(t, tn.Truncate(8192), ErrForeign)
	require.NoError(t, tn.Truncate(4096))
	_, err = tn.WriteAt([]byte{1}, 4096)
	require.ErrorIs(t, err, ErrForeign)
	require.ErrorIs(t, tn.Allocate(0, 5000, false), ErrForeign)
	require.NoError(t, tn.Allocate(0, 4096, true))
	require.NoError(t, tn.SetShape("32,32"), "a reshape keeping nbytes is fine")
	require.NoError(t, tn.SetDevice("host"), "its own device")
	require.Equal(t, byte(100), mem[100], "nothing outside the range was touched")

	// A copy out of it into tensorfs's own memory.
	dst, err := s.New(Template{Shape: dtype.Shape{4096}})
	require.NoError(t, err)
	require.NoError(t, CopyExtents([]Extent{{Dst: dst, Src: tn, N: 4096}}))
	_, err = dst.ReadAt(p, 0)
	require.NoError(t, err)
	require.Equal(t, mem[4096:4100], p)
	dst.Unlink()

	_, ok := tn.PinExport("peer", func(string) bool { return true }, true)
	require.False(t, ok, "peers read a foreign memfd over TCP, not in place")
	tn.Unlink()
	require.Equal(t, Stats{}, s.Stats())
	require.Equal(t, byte(200), mem[200], "release never frees the owner's memory")
	require.Equal(t, []byte{9, 9}, mem[8190:8192])
}

func TestRegisterReplacesOnlyWithoutImporters(t *testing.T) {
	s := newStore(t, 64<<20)
	handle, _, _ := ownedMemfd(t, 4096)
	tn, err := s.New(Template{Shape: dtype.Shape{100}})
	require.NoError(t, err)
	before := tn.Info()

	h, err := tn.Open("fh test")
	require.NoError(t, err)
	buf, err := s.Import(handle, 0, 0)
	require.NoError(t, err)
	require.ErrorIs(t, tn.Register(buf), ErrBusy)
	require.ErrorIs(t, buf.Free(), gpu.ErrFreed, "a failed Register frees the import")
	require.Equal(t, before, tn.Info(), "nothing changed")
	h.Close()

	buf, err = s.Import(handle, 0, 0)
	require.NoError(t, err)
	require.NoError(t, tn.Register(buf))
	in := tn.Info()
	require.EqualValues(t, 1, in.Generation)
	require.EqualValues(t, 4096, in.Size)
	require.Equal(t, dtype.Shape{4096}, in.Shape)
	require.Greater(t, in.MRID, before.MRID)
	require.Greater(t, in.IPCID, before.IPCID)
	require.Zero(t, s.Stats().Bytes, "the replaced allocation was freed")

	// An open handle on an unallocated tensor is fine: it takes a lease.
	tn2, err := s.New(Template{})
	require.NoError(t, err)
	h2, err := tn2.Open("fh test")
	require.NoError(t, err)
	buf, err = s.Import(handle, 0, 0)
	require.NoError(t, err)
	require.NoError(t, tn2.Register(buf))
	require.Equal(t, 1, s.Stats().Leases)
	h2.Close()
	tn2.Unlink()
	tn.Unlink()
	require.Equal(t, Stats{}, s.Stats())
}

func TestStoreImportKinds(t *testing.T) {
	s := newStore(t, 64<<20)
	for _, h := range []string{"", "nvme:x", "cuda:" + fmt.Sprintf("%0128x", 1)} {
		_, err := s.Import(h, 0, 0)
		require.ErrorIs(t, err, ErrInvalid, h)
		require.ErrorIs(t, err, gpu.ErrHandle, h)
	}
	_, err := s.Import("memfd:/proc/1/fd/x", 0, 0)
	require.ErrorIs(t, err, gpu.ErrHandle)
}

func TestRegisteredShrunkIsGone(t *testing.T) {
	s := newStore(t, 64<<20)
	handle, fd, _ := ownedMemfd(t, 8192)
	tn, err := s.New(Template{})
	require.NoError(t, err)
	buf, err := s.Import(handle, 0, 0)
	require.NoError(t, err)
	require.NoError(t, tn.Register(buf))
	require.NoError(t, unix.Ftruncate(fd, 10))
	_, err = tn.ReadAt(make([]byte, 100), 0)
	require.ErrorIs(t, err, gpu.ErrGone)
	tn.Unlink()
	require.Equal(t, Stats{}, s.Stats())
}
