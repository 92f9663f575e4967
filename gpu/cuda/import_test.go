package cuda

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/gpu"
)

// calls reads the fake's count of op, under its lock.
func (f *fakeDriver) count(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// foreign makes another process's allocation of n bytes on device d, freed
// before openFake's leak check runs (cleanups run last registered first).
func foreign(t *testing.T, f *fakeDriver, d cuDev, n int, seed byte) (string, devptr, []byte) {
	t.Helper()
	p := pattern(n, seed)
	h, base := f.foreignAlloc(d, n, p)
	t.Cleanup(func() { f.freeForeign(base) })
	return h, base, p
}

func readAll(t *testing.T, b gpu.Buffer) []byte {
	t.Helper()
	got := make([]byte, b.Size())
	_, err := b.ReadAt(got, 0)
	require.NoError(t, err)
	return got
}

func TestImportBadHandles(t *testing.T) {
	f, devs := openFake(t, 1, 0)
	d := devs[0]
	hex128 := strings.Repeat("ab", 64)
	for _, h := range []string{
		"",
		"memfd:/proc/1/fd/3",
		"cuda:",
		"cuda:" + hex128[:127],
		"cuda:" + hex128 + "0",
		"cuda:" + hex128[:126] + "zz",
		"CUDA:" + hex128,
		" cuda:" + hex128,
	} {
		_, err := d.Import(h, 0, 0)
		require.ErrorIs(t, err, gpu.ErrHandle, "%q", h)
	}
	require.Zero(t, f.count("cuIpcOpenMemHandle_v2"), "a malformed handle never reaches the driver")

	// Well formed, but no memory behind it (freed, or never exported).
	_, err := d.Import("cuda:"+hex128, 0, 0)
	require.ErrorIs(t, err, gpu.ErrHandle)
	var ce *Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "cuIpcOpenMemHandle_v2", ce.Op)

	opens := f.count("cuIpcOpenMemHandle_v2")
	h, _, _ := foreign(t, f, 0, 4096, 1)
	for _, r := range [][2]int64{{-1, 0}, {0, -1}} {
		_, err := d.Import(h, r[0], r[1])
		require.ErrorIs(t, err, gpu.ErrInvalidSize)
	}
	require.Equal(t, opens, f.count("cuIpcOpenMemHandle_v2"), "a negative range is refused before the open")
	require.Zero(t, f.mappings())
}

func TestImportRangeAndLifetime(t *testing.T) {
	f, devs := openFake(t, 1, 0)
	d := devs[0]
	const size = 3<<20 + 5
	h, base, p := foreign(t, f, 0, size, 7)
	before := d.MemInfo()

	a, err := d.Import(h, 4096, 1000)
	require.NoError(t, err)
	require.EqualValues(t, 1000, a.Size())
	require.EqualValues(t, 4096, a.Offset())
	require.Equal(t, h, a.Handle())
	require.Same(t, d, a.Device())
	require.Equal(t, p[4096:5096], readAll(t, a))
	require.Equal(t, before, d.MemInfo(), "imported memory is not tensorfs's")

	// To the end, and in upper case: the same mapping, a new id.
	b, err := d.Import(strings.ToUpper(h[:5])+strings.ToUpper(h[5:]), 100, 0)
	require.ErrorIs(t, err, gpu.ErrHandle, "the prefix is lowercase")
	require.Nil(t, b)
	b, err = d.Import("cuda:"+strings.ToUpper(h[5:]), 100, 0)
	require.NoError(t, err)
	require.EqualValues(t, size-100, b.Size())
	require.Equal(t, h, b.Handle())
	require.NotEqual(t, a.ID(), b.ID())
	require.Equal(t, a.Addr()-4096+100, b.Addr())
	require.Equal(t, 1, f.count("cuIpcOpenMemHandle_v2"), "a handle still open is not opened again")
	require.Equal(t, 1, f.mappings())

	// Out of range: refused, and nothing more held.
	for _, r := range [][2]int64{{0, size + 1}, {size, 0}, {size + 1, 0}, {size - 10, 11}} {
		_, err := d.Import(h, r[0], r[1])
		require.ErrorIs(t, err, gpu.ErrInvalidSize, "%v", r)
	}
	require.Equal(t, 1, f.mappings())
	_, err = a.ReadAt(make([]byte, 2), 999)
	require.ErrorIs(t, err, gpu.ErrInvalidSize)

	require.NoError(t, a.Free())
	require.Zero(t, f.count("cuIpcCloseMemHandle"), "b still uses the mapping")
	require.ErrorIs(t, a.Free(), gpu.ErrFreed)
	_, err = a.ReadAt(make([]byte, 1), 0)
	require.ErrorIs(t, err, gpu.ErrFreed)
	require.Equal(t, p[100:], readAll(t, b))
	require.NoError(t, b.Free())
	require.Equal(t, 1, f.count("cuIpcCloseMemHandle"))
	require.ErrorIs(t, b.Free(), gpu.ErrFreed)
	require.Equal(t, 1, f.count("cuIpcCloseMemHandle"), "closed exactly once")
	require.Zero(t, f.mappings())
	require.Equal(t, p, f.peek(base, size), "the owner's memory is untouched")
	require.Equal(t, before, d.MemInfo())

	// Opened afresh after the close.
	c, err := d.Import(h, 0, 0)
	require.NoError(t, err)
	require.Equal(t, 2, f.count("cuIpcOpenMemHandle_v2"))
	require.NoError(t, c.Free())
	require.Equal(t, 2, f.count("cuIpcCloseMemHandle"))
}

func TestImportCopies(t *testing.T) {
	f, devs := openFake(t, 2, 0)
	d := devs[0]
	const size = 5 << 20
	h, base, p := foreign(t, f, 0, size, 3)
	h2, base2, p2 := foreign(t, f, 0, 8192, 4)
	imp, err := d.Import(h, 1<<20, 0)
	require.NoError(t, err)
	defer imp.Free()
	n := imp.Size()

	// Out of the import, device to device.
	local, err := d.Alloc(n, 0)
	require.NoError(t, err)
	defer local.Free()
	dtod := f.count("cuMemcpyDtoDAsync_v2")
	require.NoError(t, gpu.Copy(local, 0, imp, 0, n))
	require.Equal(t, dtod+1, f.count("cuMemcpyDtoDAsync_v2"))
	require.Equal(t, p[1<<20:], readAll(t, local))

	// Into it: the owner sees the bytes.
	small, err := d.Alloc(1000, 0)
	require.NoError(t, err)
	defer small.Free()
	q := pattern(1000, 9)
	_, err = small.WriteAt(q, 0)
	require.NoError(t, err)
	require.NoError(t, gpu.Copy(imp, 10, small, 0, 1000))
	require.Equal(t, q, f.peek(base+1<<20+10, 1000))
	done, err := small.(*buffer).CopyTo(0, imp, 2000, 1000)
	require.True(t, done)
	require.NoError(t, err)
	require.Equal(t, q, f.peek(base+1<<20+2000, 1000))

	// Staged writes and zeroing through the import.
	w := pattern(3<<20+17, 5)
	_, err = imp.WriteAt(w, 12345)
	require.NoError(t, err)
	require.Equal(t, w, f.peek(base+1<<20+12345, int64(len(w))))
	require.NoError(t, imp.Zero(12345, 100))
	require.Equal(t, make([]byte, 100), f.peek(base+1<<20+12345, 100))

	// Import to import.
	imp2, err := d.Import(h2, 0, 0)
	require.NoError(t, err)
	require.NoError(t, gpu.Copy(imp, 0, imp2, 0, 8192))
	require.Equal(t, p2, f.peek(base+1<<20, 8192))
	require.Equal(t, p2, f.peek(base2, 8192))
	require.NoError(t, imp2.Free())

	// Across devices: the import on cuda:1 (memory of cuda:0, mapped with
	// peer access) into cuda:0, and the cuda:0 import into cuda:1.
	imp1, err := devs[1].Import(h, 0, 4096)
	require.NoError(t, err)
	require.Same(t, devs[1], imp1.Device())
	require.Equal(t, 2, f.mappings(), "one mapping per context")
	peer := f.count("cuMemcpyPeerAsync")
	require.NoError(t, gpu.Copy(local, 0, imp1, 0, 4096))
	require.Equal(t, peer+1, f.count("cuMemcpyPeerAsync"))
	got := make([]byte, 4096)
	_, err = local.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, f.peek(base, 4096), got)
	other, err := devs[1].Alloc(4096, 0)
	require.NoError(t, err)
	require.NoError(t, gpu.Copy(other, 0, imp, 0, 4096))
	require.Equal(t, f.peek(base+1<<20, 4096), readAll(t, other))
	require.NoError(t, other.Free())
	require.NoError(t, imp1.Free())

	// To host memory, through the staging buffers.
	host, err := gpu.NewHost(64 << 20)
	require.NoError(t, err)
	defer host.Close()
	hb, err := host.Alloc(4096, 0)
	require.NoError(t, err)
	defer hb.Free()
	require.NoError(t, gpu.Copy(hb, 0, imp, 0, 4096))
	require.Equal(t, f.peek(base+1<<20, 4096), readAll(t, hb))
	require.Zero(t, d.MemInfo().Used-local.(*buffer).a.size-small.(*buffer).a.size)
}

func TestImportOwnHandle(t *testing.T) {
	f, devs := openFake(t, 2, 0)
	d := devs[0]
	keep, err := d.Alloc(1000, 0)
	require.NoError(t, err)
	own, err := d.Alloc(1000, 0)
	require.NoError(t, err)
	require.NotZero(t, own.Offset())
	p := pattern(1000, 11)
	_, err = own.WriteAt(p, 0)
	require.NoError(t, err)
	used := d.MemInfo().Used

	// On another device of this process too: the alias is the memory's.
	for _, imp := range []*Device{d, devs[1]} {
		al, err := imp.Import(own.Handle(), own.Offset(), 0)
		require.NoError(t, err)
		require.Zero(t, f.count("cuIpcOpenMemHandle_v2"), "the driver is not asked to open its own handle")
		require.Same(t, d, al.Device())
		require.Equal(t, own.Addr(), al.Addr())
		require.EqualValues(t, ArenaSize-own.Offset(), al.Size())
		require.Equal(t, own.Handle(), al.Handle())
		require.NotEqual(t, own.ID(), al.ID())
		got := make([]byte, 1000)
		_, err = al.ReadAt(got, 0)
		require.NoError(t, err)
		require.Equal(t, p, got)
		require.NoError(t, al.Free())
		require.ErrorIs(t, al.Free(), gpu.ErrFreed)
	}
	_, err = d.Import(own.Handle(), 0, ArenaSize+1)
	require.ErrorIs(t, err, gpu.ErrInvalidSize)
	require.Equal(t, used, d.MemInfo().Used)

	// The owner frees its memory first: the alias keeps it.
	big, err := d.Alloc(ArenaSize, 0)
	require.NoError(t, err)
	al, err := devs[1].Import(big.Handle(), 0, 0)
	require.NoError(t, err)
	q := pattern(ArenaSize, 12)
	_, err = al.WriteAt(q, 0)
	require.NoError(t, err)
	require.NoError(t, big.Free())
	require.Equal(t, used+ArenaSize, d.MemInfo().Used, "still held for the alias")
	_, err = d.Import(big.Handle(), 0, 0)
	require.ErrorIs(t, err, gpu.ErrHandle, "memory its owner freed is not importable")
	require.Equal(t, q, readAll(t, al))
	require.NoError(t, al.Free())
	require.Equal(t, used, d.MemInfo().Used)

	require.NoError(t, own.Free())
	require.NoError(t, keep.Free())
	require.Zero(t, d.MemInfo().Used)

	// Exported by this process outside the allocator: the driver refuses it.
	h, free, err := d.RawAllocExport(64 << 10)
	require.NoError(t, err)
	_, err = d.Import(h, 0, 0)
	require.ErrorIs(t, err, gpu.ErrHandle)
	var ce *Error
	require.ErrorAs(t, err, &ce)
	require.EqualValues(t, errInvalidContext, ce.Code)
	require.Contains(t, err.Error(), "this process")
	require.NoError(t, free())
}

func TestImportDriverFailures(t *testing.T) {
	f, devs := openFake(t, 1, 0)
	d := devs[0]
	h, _, _ := foreign(t, f, 0, 4096, 1)
	f.setFail("cuMemGetAddressRange_v2", 999)
	_, err := d.Import(h, 0, 0)
	require.ErrorIs(t, err, gpu.ErrHandle)
	require.Equal(t, 1, f.count("cuIpcCloseMemHandle"), "the mapping is closed again")
	require.Zero(t, f.mappings())
	f.setFail("cuMemGetAddressRange_v2", success)

	b, err := d.Import(h, 0, 0)
	require.NoError(t, err)
	f.setFail("cuIpcCloseMemHandle", 999)
	err = b.Free()
	var ce *Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "cuIpcCloseMemHandle", ce.Op)
	require.ErrorIs(t, b.Free(), gpu.ErrFreed)
	f.setFail("cuIpcCloseMemHandle", success)
	// The fake kept the mapping the failed close left: unmap it the way
	// the driver would at context teardown, so the leak check holds.
	f.mu.Lock()
	for p, a := range f.allocs {
		if a.mapOf != 0 {
			delete(f.allocs, p)
		}
	}
	f.mu.Unlock()
}

func TestImportCloseWithImportsOpen(t *testing.T) {
	f := newFake(1, fakeGPU)
	gdevs, err := open(f, 0)
	require.NoError(t, err)
	d := gdevs[0].(*Device)
	h, base := f.foreignAlloc(0, 4096, nil)
	b, err := d.Import(h, 0, 0)
	require.NoError(t, err)
	err = d.Close()
	require.ErrorContains(t, err, "1 IPC imports still open")
	require.Zero(t, f.mappings(), "Close unmaps what was left")
	require.NoError(t, b.Free(), "a late Free does not close twice")
	require.Equal(t, 1, f.count("cuIpcCloseMemHandle"))
	_, err = d.Import(h, 0, 0)
	require.ErrorIs(t, err, gpu.ErrFreed)
	f.freeForeign(base)
	s := f.state()
	require.Empty(t, s.violations)
	require.Empty(t, s.allocs)
}

func TestImportConcurrent(t *testing.T) {
	f, devs := openFake(t, 2, 0)
	h, _, p := foreign(t, f, 0, 1<<20, 2)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 8 {
		wg.Go(func() {
			d := devs[g%2]
			for i := range 20 {
				off := int64((g*4099 + i*511) % (1 << 19))
				b, err := d.Import(h, off, 4096)
				if err != nil {
					errs <- err
					return
				}
				got := make([]byte, 4096)
				if _, err := b.ReadAt(got, 0); err != nil {
					errs <- err
				} else if !bytes.Equal(got, p[off:off+4096]) {
					errs <- errors.New("wrong bytes through a shared mapping")
				}
				if err := b.Free(); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Zero(t, f.mappings())
	require.Equal(t, f.count("cuIpcOpenMemHandle_v2"), f.count("cuIpcCloseMemHandle"))
}
