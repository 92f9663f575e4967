package gpu

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestHostAllocLimitAndFree(t *testing.T) {
	h, err := NewHost(1 << 20)
	require.NoError(t, err)
	require.EqualValues(t, 1<<20, h.MemInfo().Total)
	a, err := h.Alloc(768<<10, 0)
	require.NoError(t, err)
	_, err = h.Alloc(512<<10, 0)
	require.ErrorIs(t, err, ErrOutOfMemory)
	_, err = h.Alloc(0, 0)
	require.ErrorIs(t, err, ErrInvalidSize)
	require.EqualValues(t, 768<<10, h.MemInfo().Used)
	require.NoError(t, a.Free())
	require.ErrorIs(t, a.Free(), ErrFreed)
	require.Zero(t, h.MemInfo().Used)
	_, err = NewHost(-1)
	require.ErrorIs(t, err, ErrInvalidSize)
}

func TestHostReadWriteCopyBounds(t *testing.T) {
	h, err := NewHost(1 << 20)
	require.NoError(t, err)
	a, _ := h.Alloc(4096, 0)
	b, _ := h.Alloc(4096, 0)
	defer a.Free()
	defer b.Free()
	_, err = a.WriteAt([]byte("tensor"), 100)
	require.NoError(t, err)
	require.NoError(t, Copy(b, 0, a, 100, 6))
	got := make([]byte, 6)
	_, err = b.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, "tensor", string(got))
	_, err = a.WriteAt(make([]byte, 10), 4090)
	require.ErrorIs(t, err, ErrInvalidSize)
	_, err = a.ReadAt(make([]byte, 1), -1)
	require.ErrorIs(t, err, ErrInvalidSize)
	require.ErrorIs(t, Copy(b, 4000, a, 0, 200), ErrInvalidSize)
	// Offsets come from peers (an IPC descriptor's offset): one whose sum
	// with n wraps past MaxInt64 is refused, not sliced (a panic) or read
	// out of bounds.
	const huge = int64(^uint64(0) >> 1)
	require.ErrorIs(t, Copy(b, 0, a, huge-5, 100), ErrInvalidSize)
	require.ErrorIs(t, Copy(b, huge-5, a, 0, 100), ErrInvalidSize)
}

// TestHostHandleIsSealed opens the exported memfd the way another process
// does and checks that it sees the bytes and cannot shrink the memory under
// the daemon's mapping (which would be a SIGBUS in the daemon).
func TestHostHandleIsSealed(t *testing.T) {
	h, err := NewHost(1 << 20)
	require.NoError(t, err)
	a, err := h.Alloc(8192, 0)
	require.NoError(t, err)
	defer a.Free()
	_, err = a.WriteAt([]byte("shared"), 0)
	require.NoError(t, err)
	path, ok := strings.CutPrefix(a.Handle(), "memfd:")
	require.True(t, ok, a.Handle())
	require.Equal(t, fmt.Sprintf("/proc/%d/fd/", os.Getpid()), path[:len(path)-len(path[strings.LastIndex(path, "/")+1:])])
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	buf := make([]byte, 6)
	_, err = f.ReadAt(buf, 0)
	require.NoError(t, err)
	require.Equal(t, "shared", string(buf))
	require.ErrorIs(t, unix.Ftruncate(int(f.Fd()), 4096), unix.EPERM)
	require.ErrorIs(t, unix.Ftruncate(int(f.Fd()), 1<<20), unix.EPERM)
}

// TestHostRecyclesSmallBuffers: a freed small buffer is reused, zeroed, with a
// new id, only for the same size and owner, and released after spareTTL.
func TestHostRecyclesSmallBuffers(t *testing.T) {
	h, err := NewHost(64 << 20)
	require.NoError(t, err)
	defer h.Close()
	a, err := h.Alloc(65536, 1000)
	require.NoError(t, err)
	_, err = a.WriteAt([]byte("secret"), 0)
	require.NoError(t, err)
	addr, id := a.Addr(), a.ID()
	require.NoError(t, a.Free())
	require.Zero(t, h.MemInfo().Used, "a recycled buffer is not in use")

	other, err := h.Alloc(65536, 2000)
	require.NoError(t, err)
	require.NotEqual(t, addr, other.Addr(), "another owner never gets it")
	b, err := h.Alloc(65536, 1000)
	require.NoError(t, err)
	require.Equal(t, addr, b.Addr(), "same size and owner reuses it")
	require.NotEqual(t, id, b.ID(), "with a new allocation id")
	got := make([]byte, 6)
	_, err = b.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, make([]byte, 6), got, "zeroed")
	require.NoError(t, b.Free())
	require.NoError(t, other.Free())

	require.Eventually(t, func() bool {
		h.spareMu.Lock()
		defer h.spareMu.Unlock()
		return len(h.spares) == 0 && h.spareBytes == 0
	}, 5*time.Second, 50*time.Millisecond, "spares are released when idle")
}

// TestHostCountsWholePages: the cap counts what the kernel commits (pages),
// so many tiny tensors cannot exceed it.
func TestHostCountsWholePages(t *testing.T) {
	h, err := NewHost(16 * pageSize)
	require.NoError(t, err)
	defer h.Close()
	var bufs []Buffer
	for i := 0; i < 16; i++ {
		b, err := h.Alloc(1, 0)
		require.NoError(t, err)
		bufs = append(bufs, b)
	}
	require.EqualValues(t, 16*pageSize, h.MemInfo().Used)
	_, err = h.Alloc(1, 0)
	require.ErrorIs(t, err, ErrOutOfMemory)
	for _, b := range bufs {
		require.NoError(t, b.Free())
	}
	require.Zero(t, h.MemInfo().Used)
}

// TestHostRecyclesLargeBuffers: a freed large buffer is kept (zeroed in the
// background) for the next allocation of its size and owner, is not counted
// as used, and gives way to new memory that needs the room under the cap.
func TestHostRecyclesLargeBuffers(t *testing.T) {
	const big = 8 << 20
	h, err := NewHost(64 << 20)
	require.NoError(t, err)
	defer h.Close()
	a, err := h.Alloc(big, 1000)
	require.NoError(t, err)
	_, err = a.WriteAt(bytes.Repeat([]byte("secret"), 1000), big-6000)
	require.NoError(t, err)
	addr := a.Addr()
	require.NoError(t, a.Free())
	require.Zero(t, h.MemInfo().Used, "a kept buffer is not in use")
	b, err := h.Alloc(big, 1000)
	require.NoError(t, err)
	require.Equal(t, addr, b.Addr(), "same size and owner reuses it")
	got := make([]byte, 6000)
	_, err = b.ReadAt(got, big-6000)
	require.NoError(t, err)
	require.Equal(t, make([]byte, 6000), got, "zeroed")
	require.NoError(t, b.Free())

	// Kept memory counts against the cap: 8 MiB kept, 60 MiB wanted.
	c, err := h.Alloc(60<<20, 1000)
	require.NoError(t, err, "the kept buffer gives way")
	h.spareMu.Lock()
	require.Zero(t, h.spareBytes)
	h.spareMu.Unlock()
	require.NoError(t, c.Free())
	h.spareMu.Lock()
	require.Zero(t, h.spareBytes, "60 MiB is over a quarter of the 64 MiB cap: not kept")
	h.spareMu.Unlock()

	d, err := h.Alloc(big, 7)
	require.NoError(t, err)
	require.NoError(t, d.Free())
	require.Eventually(t, func() bool {
		h.spareMu.Lock()
		defer h.spareMu.Unlock()
		return len(h.spares) == 0 && h.spareBytes == 0
	}, 5*time.Second, 50*time.Millisecond, "large spares are released when idle")
}

// TestHostAllocUninit: AllocUninit hands a recycled buffer of the same owner
// over without clearing it (small: as it was; large: the background clear
// stopped, whatever it had done), every byte still writable; memory of
// another owner, and new memory, read as zeros; Alloc still zeroes.
func TestHostAllocUninit(t *testing.T) {
	h, err := NewHost(1 << 30) // large spares: up to a quarter of it
	require.NoError(t, err)
	defer h.Close()
	// Spares stay until Close: a slow run (-race, a loaded CI machine) must
	// not see one released by its TTL between a free and the next take.
	h.spareMu.Lock()
	h.trimming = true
	h.spareMu.Unlock()
	for _, size := range []int64{64 << 10, 64 << 20} {
		old := bytes.Repeat([]byte{0xa5}, int(size))
		a, err := h.Alloc(size, 1000)
		require.NoError(t, err)
		_, err = a.WriteAt(old, 0)
		require.NoError(t, err)
		addr := a.Addr()
		require.NoError(t, a.Free())

		other, err := h.AllocUninit(size, 1001)
		require.NoError(t, err)
		h.spareMu.Lock()
		kept := len(h.spares[spareKey{size, 1000}])
		h.spareMu.Unlock()
		require.Equal(t, 1, kept, "another owner never gets the spare")
		got := make([]byte, size)
		_, err = other.ReadAt(got, 0)
		require.NoError(t, err)
		require.Equal(t, make([]byte, size), got, "new memory is zero")
		require.NoError(t, other.Free())

		b, err := AllocUninit(h, size, 1000)
		require.NoError(t, err)
		require.Equal(t, addr, b.Addr(), "same size and owner reuses it")
		_, err = b.ReadAt(got, 0)
		require.NoError(t, err)
		if size <= spareMaxSize {
			// (A large one holds whatever its stopped clear left.)
			require.Equal(t, old, got, "a small spare is handed over as it was")
		}
		// The background clear has stopped: what the caller writes stays.
		fill := bytes.Repeat([]byte{0x3c}, int(size))
		_, err = b.WriteAt(fill, 0)
		require.NoError(t, err)
		time.Sleep(10 * time.Millisecond)
		_, err = b.ReadAt(got, 0)
		require.NoError(t, err)
		require.Equal(t, fill, got, "nothing clears the buffer under its new owner")
		require.NoError(t, b.Free())

		c, err := h.Alloc(size, 1000)
		require.NoError(t, err)
		require.Equal(t, addr, c.Addr())
		_, err = c.ReadAt(got, 0)
		require.NoError(t, err)
		require.Equal(t, make([]byte, size), got, "Alloc still zeroes")
		require.NoError(t, c.Free())
	}
}

// TestHostFreeAfterClose: a buffer freed after its Host was closed is
// unmapped and its memfd closed at once, not kept as a spare of a device
// nobody asks again (it held the fd until the trim, and another test's fd
// count saw it go).
func TestHostFreeAfterClose(t *testing.T) {
	fds := fdCount(t)
	h, err := NewHost(64 << 20)
	require.NoError(t, err)
	small, err := h.Alloc(4096, 0)
	require.NoError(t, err)
	large, err := h.Alloc(16<<20, 0)
	require.NoError(t, err)
	require.NoError(t, h.Close())
	require.NoError(t, small.Free())
	require.NoError(t, large.Free())
	require.Equal(t, fds, fdCount(t), "no memfd left open")
}
