package gpu

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// ownerMemfd plays the owning process: a memfd of size bytes holding
// byte(i*7) at i, with the given seals, and the owner's own mapping of it.
func ownerMemfd(t *testing.T, size int, seals int) (fd int, mem []byte) {
	t.Helper()
	fd, err := unix.MemfdCreate("owner", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	require.NoError(t, err)
	require.NoError(t, unix.Ftruncate(fd, int64(size)))
	mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	for i := range mem {
		mem[i] = byte(i * 7)
	}
	if seals != 0 {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals)
		require.NoError(t, err)
	}
	t.Cleanup(func() { unix.Munmap(mem); unix.Close(fd) })
	return fd, mem
}

func handleOf(fd int) string { return fmt.Sprintf("memfd:/proc/%d/fd/%d", os.Getpid(), fd) }

// fdCount counts this process's fds open on memfds (other fds come and go
// with the Go runtime's poller).
func fdCount(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(target, "/memfd:") {
			n++
		}
	}
	return n
}

func TestHostImportReadWriteFree(t *testing.T) {
	for _, tc := range []struct {
		name   string
		seals  int
		mapped bool
	}{{"shrinkable", 0, false}, {"sealed", unix.F_SEAL_SHRINK, true}, {"write-sealed", unix.F_SEAL_SHRINK | unix.F_SEAL_FUTURE_WRITE, false}} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := NewHost(1 << 20)
			require.NoError(t, err)
			fd, mem := ownerMemfd(t, 3*4096, tc.seals)
			fds := fdCount(t)

			b, err := h.Import(handleOf(fd), 5000, 3000)
			require.NoError(t, err)
			require.EqualValues(t, 3000, b.Size())
			require.EqualValues(t, 5000, b.Offset())
			require.Equal(t, tc.mapped, b.(*importBuffer).mem != nil)
			require.NotZero(t, b.Addr())
			require.Zero(t, h.MemInfo().Used, "imported memory is not tensorfs's")
			got := make([]byte, 3000)
			_, err = b.ReadAt(got, 0)
			require.NoError(t, err)
			require.Equal(t, mem[5000:8000], got)
			_, err = b.ReadAt(got[:2], 2999)
			require.ErrorIs(t, err, ErrInvalidSize)

			// The handle opens the same memory in another process.
			other, err := os.Open(b.Handle()[len("memfd:"):])
			require.NoError(t, err)
			one := make([]byte, 1)
			_, err = other.ReadAt(one, 5001)
			require.NoError(t, err)
			require.Equal(t, mem[5001], one[0])
			other.Close()

			_, err = b.WriteAt([]byte("xyz"), 10)
			if tc.seals&unix.F_SEAL_FUTURE_WRITE != 0 {
				require.ErrorIs(t, err, unix.EPERM)
			} else {
				require.NoError(t, err)
				require.Equal(t, "xyz", string(mem[5010:5013]), "the owner sees the write")
				require.NoError(t, b.Zero(10, 3))
				require.Equal(t, []byte{0, 0, 0}, mem[5010:5013])
			}

			// Copies to and from tensorfs's own memory.
			own, err := h.Alloc(3000, 0)
			require.NoError(t, err)
			require.NoError(t, Copy(own, 0, b, 0, 3000))
			if tc.seals&unix.F_SEAL_FUTURE_WRITE == 0 {
				require.NoError(t, Copy(b, 0, own, 0, 3000))
			}
			require.NoError(t, own.Free())

			require.NoError(t, b.Free())
			require.ErrorIs(t, b.Free(), ErrFreed)
			_, err = b.ReadAt(got, 0)
			require.ErrorIs(t, err, ErrFreed)
			h.Close() // the recycled spare of own
			require.Equal(t, fds, fdCount(t), "Free closes the daemon's fd")
			require.Equal(t, byte(8000*7%256), mem[8000], "the owner's memory is intact")
		})
	}
}

func TestHostImportWholeAndFile(t *testing.T) {
	h, err := NewHost(1 << 20)
	require.NoError(t, err)
	fd, mem := ownerMemfd(t, 10000, 0)
	b, err := h.Import(handleOf(fd), 0, 0)
	require.NoError(t, err)
	require.EqualValues(t, 10000, b.Size())
	got := make([]byte, 10000)
	_, err = b.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, mem, got)

	f := os.NewFile(uintptr(fd), "owner")
	c, err := h.ImportFile(f, 100, 0)
	require.NoError(t, err)
	require.EqualValues(t, 9900, c.Size())
	require.NotEqual(t, b.ID(), c.ID())
	// Two imports of one memfd have disjoint address ranges for the MR registry.
	lo, hi := b.Addr(), c.Addr()
	if lo > hi {
		lo, hi = hi, lo
	}
	require.GreaterOrEqual(t, uint64(hi-lo), uint64(9900))
	require.NoError(t, b.Free())
	require.NoError(t, c.Free())
}

func TestHostImportBadHandles(t *testing.T) {
	h, err := NewHost(1 << 20)
	require.NoError(t, err)
	fd, _ := ownerMemfd(t, 4096, 0)
	fds := fdCount(t)
	for _, bad := range []string{"", "cuda:00", "memfd:", "memfd:/tmp/x", "memfd:/proc/self/fd/3", fmt.Sprintf("memfd:/proc/%d/fd/%d/", os.Getpid(), fd), "memfd:/proc/0/fd/1"} {
		_, err := h.Import(bad, 0, 0)
		require.ErrorIs(t, err, ErrHandle, bad)
	}
	_, err = h.Import(fmt.Sprintf("memfd:/proc/%d/fd/999999", os.Getpid()), 0, 0)
	require.ErrorIs(t, err, ErrHandle)
	require.ErrorIs(t, err, unix.ENOENT)

	reg, err := os.Create(filepath.Join(t.TempDir(), "plain"))
	require.NoError(t, err)
	defer reg.Close()
	require.NoError(t, reg.Truncate(4096))
	_, err = h.Import(handleOf(int(reg.Fd())), 0, 0)
	require.ErrorIs(t, err, ErrHandle, "a regular file is not a memfd")

	for _, r := range [][2]int64{{0, 4097}, {4096, 0}, {4000, 97}, {-1, 10}, {0, -1}} {
		_, err := h.Import(handleOf(fd), r[0], r[1])
		require.ErrorIs(t, err, ErrInvalidSize, "%v", r)
	}
	require.Equal(t, fds, fdCount(t), "failed imports leave no fd open")
}

// TestHostImportShrunk: the owner shrinks an unsealed memfd under an import;
// reads and writes past the new end fail with ErrGone (no SIGBUS, no growth).
func TestHostImportShrunk(t *testing.T) {
	h, err := NewHost(1 << 20)
	require.NoError(t, err)
	fd, _ := ownerMemfd(t, 8192, 0)
	b, err := h.Import(handleOf(fd), 0, 0)
	require.NoError(t, err)
	defer b.Free()
	require.NoError(t, unix.Ftruncate(fd, 100))
	p := make([]byte, 200)
	_, err = b.ReadAt(p, 0)
	require.ErrorIs(t, err, ErrGone)
	_, err = b.ReadAt(p[:50], 0)
	require.NoError(t, err, "what is left is still readable")
	_, err = b.WriteAt(p[:100], 8000)
	require.ErrorIs(t, err, ErrGone)
	require.ErrorIs(t, b.Zero(0, 8192), ErrGone)
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(fd, &st))
	require.EqualValues(t, 100, st.Size, "a failed write does not grow the owner's memfd")
	own, _ := h.Alloc(8192, 0)
	defer own.Free()
	require.ErrorIs(t, Copy(own, 0, b, 0, 8192), ErrGone)
}

// TestHostImportReadOnly: a sealed memfd opened read-only (how a peer daemon
// opens another daemon's export) is mapped read-only; writes are refused
// with ErrHandle instead of faulting.
func TestHostImportReadOnly(t *testing.T) {
	h, err := NewHost(0)
	require.NoError(t, err)
	defer h.Close()
	fd, err := unix.MemfdCreate("tensorfs", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, unix.Ftruncate(fd, 8192))
	_, err = unix.Pwrite(fd, []byte("hello"), 4096)
	require.NoError(t, err)
	_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)
	require.NoError(t, err)
	f, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", fd))
	require.NoError(t, err)
	defer f.Close()
	b, err := h.ImportFile(f, 0, 0)
	require.NoError(t, err)
	p := make([]byte, 5)
	_, err = b.ReadAt(p, 4096)
	require.NoError(t, err)
	require.Equal(t, "hello", string(p))
	_, err = b.WriteAt([]byte("x"), 0)
	require.ErrorIs(t, err, ErrHandle)
	require.ErrorIs(t, b.Zero(0, 1), ErrHandle)
	require.NoError(t, b.Free())
}
