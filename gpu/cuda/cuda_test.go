package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/gpu"
)

const fakeGPU = 64 << 20 // bytes of each fake GPU

// openFake opens ndev fake GPUs and, at cleanup, requires that nothing was
// left behind and no driver call ran without its context.
func openFake(t *testing.T, ndev int, maxMemory int64) (*fakeDriver, []*Device) {
	t.Helper()
	f := newFake(ndev, fakeGPU)
	gdevs, err := open(f, maxMemory)
	require.NoError(t, err)
	var devs []*Device
	for _, d := range gdevs {
		d := d.(*Device)
		d.linger = 0 // free empty arenas at once; TestArenaLinger tests the delay
		devs = append(devs, d)
	}
	t.Cleanup(func() {
		for _, d := range devs {
			require.NoError(t, d.Close())
		}
		s := f.state()
		require.Empty(t, s.violations)
		require.Empty(t, s.allocs, "device memory left allocated")
		require.Zero(t, s.host, "page-locked memory left")
		require.Zero(t, s.streams, "streams left")
		require.Zero(t, s.modules, "modules left loaded")
		require.Zero(t, s.retained, "primary contexts left retained")
	})
	return f, devs
}

func pattern(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*31) ^ seed ^ byte(i>>8)
	}
	return p
}

func TestBindMissingLibrary(t *testing.T) {
	_, err := bind(&fakeLib{openErr: errors.New("cannot open shared object file")}, LibraryName)
	require.ErrorIs(t, err, gpu.ErrNoDriver)
	require.Contains(t, err.Error(), "libcuda.so.1")

	// The real loader, on a name that exists nowhere.
	_, err = bind(&dlLibrary{name: "libtensorfs-no-such-driver.so.1"}, "libtensorfs-no-such-driver.so.1")
	require.ErrorIs(t, err, gpu.ErrNoDriver)
	require.Contains(t, err.Error(), "libtensorfs-no-such-driver.so.1")
}

func TestBindResolvesV2OnceAndClosesOnMissingSymbol(t *testing.T) {
	l := &fakeLib{}
	d, err := bind(l, LibraryName)
	require.NoError(t, err)
	require.False(t, l.closed)
	for _, want := range []string{"cuMemAlloc_v2", "cuMemFree_v2", "cuMemGetInfo_v2", "cuDevicePrimaryCtxRelease_v2",
		"cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoDAsync_v2", "cuStreamDestroy_v2", "cuIpcGetMemHandle"} {
		require.Contains(t, l.looked, want)
	}
	for _, old := range []string{"cuMemAlloc", "cuMemFree", "cuMemGetInfo", "cuMemcpyHtoDAsync"} {
		require.NotContains(t, l.looked, old, "the 32-bit ABI symbol must never be bound")
	}
	require.Len(t, l.looked, len(d.sym.table()), "each symbol looked up once")
	for _, s := range d.sym.table() {
		require.NotZero(t, *s.ptr, s.name)
	}

	l = &fakeLib{missing: "cuMemcpyPeerAsync"}
	_, err = bind(l, LibraryName)
	require.ErrorIs(t, err, gpu.ErrNoDriver)
	require.Contains(t, err.Error(), "cuMemcpyPeerAsync")
	require.True(t, l.closed)
}

func TestErrorNaming(t *testing.T) {
	f := newFake(1, fakeGPU)
	err := check(f, "cuMemAlloc_v2", errOutOfMemory)
	require.EqualError(t, err, "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2)")
	require.ErrorIs(t, fmt.Errorf("wrapped: %w", err), gpu.ErrOutOfMemory)
	var ce *Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, 2, ce.Code)

	// Names the driver does not give come from the table, then the number.
	require.EqualError(t, check(f, "cuCtxSetCurrent", 201), "cuCtxSetCurrent: CUDA_ERROR_INVALID_CONTEXT (201)")
	require.EqualError(t, check(f, "cuInit", 12345), "cuInit: CUDA_ERROR_12345 (12345)")
	require.EqualError(t, check(nil, "cuInit", 999), "cuInit: CUDA_ERROR_UNKNOWN (999)")
	require.NoError(t, check(f, "cuInit", success))
	require.NotErrorIs(t, check(f, "cuInit", 999), gpu.ErrOutOfMemory)
	require.ErrorIs(t, check(f, "cuInit", errNoDevice), gpu.ErrNoDevice)
}

func TestOpenNoGPU(t *testing.T) {
	_, err := open(newFake(0, fakeGPU), 0)
	require.ErrorIs(t, err, gpu.ErrNoDevice)

	f := newFake(1, fakeGPU)
	f.setFail("cuInit", errNoDevice)
	_, err = open(f, 0)
	require.ErrorIs(t, err, gpu.ErrNoDevice)
	require.Contains(t, err.Error(), "CUDA_ERROR_NO_DEVICE")

	// A failure on the second GPU releases the first one's context.
	f = newFake(2, fakeGPU)
	f.setFail("cuMemGetInfo_v2", 999)
	_, err = open(f, 0)
	require.ErrorContains(t, err, "CUDA_ERROR_UNKNOWN")
	require.Zero(t, f.state().retained)

	_, err = Open(-1)
	require.ErrorIs(t, err, gpu.ErrInvalidSize)
}

func TestNamesAndMemInfo(t *testing.T) {
	_, devs := openFake(t, 2, 0)
	require.Equal(t, "cuda:0", devs[0].Name())
	require.Equal(t, "cuda:1", devs[1].Name())
	require.Equal(t, gpu.MemInfo{Total: fakeGPU}, devs[0].MemInfo())
	require.NoError(t, devs[1].SetMaxMemory(8<<20))
	require.Equal(t, gpu.MemInfo{Total: 8 << 20}, devs[1].MemInfo())
	require.NoError(t, devs[1].SetMaxMemory(1<<40))
	require.EqualValues(t, fakeGPU, devs[1].MemInfo().Total, "a cap past the device is the device")
	require.ErrorIs(t, devs[1].SetMaxMemory(-1), gpu.ErrInvalidSize)
}

func TestArenaCarving(t *testing.T) {
	f, devs := openFake(t, 1, 0)
	d := devs[0]
	var bufs []gpu.Buffer
	offsets := map[int64]bool{}
	for i := range 32 {
		b, err := d.Alloc(64<<10, 1)
		require.NoError(t, err)
		bufs = append(bufs, b)
		require.Equal(t, bufs[0].ID(), b.ID(), "buffer %d: 32 of 64 KiB share one arena", i)
		require.Equal(t, bufs[0].Handle(), b.Handle())
		require.Zero(t, b.Offset()%Align)
		require.False(t, offsets[b.Offset()])
		offsets[b.Offset()] = true
		require.EqualValues(t, 64<<10, b.Size())
		require.Equal(t, bufs[0].Addr()+uintptr(b.Offset()), b.Addr())
	}
	require.EqualValues(t, ArenaSize, d.MemInfo().Used)
	require.Equal(t, []int{ArenaSize}, f.state().allocs)

	b, err := d.Alloc(64<<10, 1)
	require.NoError(t, err)
	bufs = append(bufs, b)
	require.NotEqual(t, bufs[0].ID(), b.ID(), "the 33rd needs a second arena")
	require.Greater(t, b.ID(), bufs[0].ID(), "ids are never reused")
	require.EqualValues(t, 2*ArenaSize, d.MemInfo().Used)

	h := bufs[0].Handle()
	require.True(t, strings.HasPrefix(h, "cuda:"), h)
	require.Len(t, h, 5+128)
	require.Equal(t, strings.ToLower(h), h)

	for _, b := range bufs {
		require.NoError(t, b.Free())
	}
	require.Zero(t, d.MemInfo().Used)
	require.Empty(t, f.state().allocs, "an empty arena goes back to the driver")
}

func TestArenaCoalescingAndReuse(t *testing.T) {
	_, devs := openFake(t, 1, 0)
	d := devs[0]
	a, err := d.Alloc(1<<20, 7)
	require.NoError(t, err)
	b, err := d.Alloc(512<<10-100, 7) // rounded up to Align
	require.NoError(t, err)
	c, err := d.Alloc(512<<10, 7)
	require.NoError(t, err)
	require.Equal(t, a.ID(), c.ID())
	require.EqualValues(t, []int64{0, 1 << 20, 1<<20 + 512<<10}, []int64{a.Offset(), b.Offset(), c.Offset()})
	require.EqualValues(t, 512<<10-100, b.Size())

	// Free b then a: one 1.5 MiB extent at 0, which a 1.5 MiB buffer takes.
	require.NoError(t, b.Free())
	require.NoError(t, a.Free())
	e, err := d.Alloc(3<<19, 7)
	require.NoError(t, err)
	require.Equal(t, c.ID(), e.ID())
	require.Zero(t, e.Offset())
	require.EqualValues(t, ArenaSize, d.MemInfo().Used)

	// A reused range reads as zeros even though a tensor wrote it before.
	_, err = e.WriteAt(bytes.Repeat([]byte{9}, 1000), 0)
	require.NoError(t, err)
	require.NoError(t, e.Free())
	g, err := d.Alloc(1000, 7)
	require.NoError(t, err)
	require.Zero(t, g.Offset())
	got := make([]byte, 1000)
	_, err = g.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, make([]byte, 1000), got)
	require.NoError(t, g.Free())
	require.NoError(t, c.Free())
	require.Zero(t, d.MemInfo().Used)
}

func TestArenaGiveCoalesces(t *testing.T) {
	a := &allocation{size: ArenaSize, arena: true}
	pools{}.add(a)
	var offs []int64
	for range 8 {
		off, ok := a.take(256 << 10)
		require.True(t, ok)
		offs = append(offs, off)
	}
	_, ok := a.take(Align)
	require.False(t, ok)
	for _, i := range []int{1, 5, 3, 0, 7, 2, 6, 4} { // every neighbour case
		a.give(offs[i], 256<<10)
	}
	require.Equal(t, []extent{{0, ArenaSize}}, a.free)
	require.Zero(t, a.inUse)
}

func TestOwnersNeverShareAnArena(t *testing.T) {
	_, devs := openFake(t, 1, 0)
	d := devs[0]
	a, err := d.Alloc(4096, 1000)
	require.NoError(t, err)
	b, err := d.Alloc(4096, 1001)
	require.NoError(t, err)
	c, err := d.Alloc(4096, 1000)
	require.NoError(t, err)
	require.NotEqual(t, a.ID(), b.ID())
	require.NotEqual(t, a.Handle(), b.Handle())
	require.Equal(t, a.ID(), c.ID())
	require.EqualValues(t, 2*ArenaSize, d.MemInfo().Used)
	for _, x := range []gpu.Buffer{a, b, c} {
		require.NoError(t, x.Free())
	}
}

func TestLargeBuffersGetTheirOwnAllocation(t *testing.T) {
	f, devs := openFake(t, 1, 0)
	d := devs[0]
	a, err := d.Alloc(ArenaSize, 1)
	require.NoError(t, err)
	b, err := d.Alloc(3<<20+1, 1)
	require.NoError(t, err)
	require.EqualValues(t, 3<<20+1, b.Size(), "Size is exact")
	require.Zero(t, a.Offset())
	require.Zero(t, b.Offset())
	require.NotEqual(t, a.ID(), b.ID())
	require.Equal(t, []int{ArenaSize, 2 * ArenaSize}, f.state().allocs, "rounded up to 2 MiB")
	require.EqualValues(t, 3*ArenaSize, d.MemInfo().Used)
	// Zeroed, although cuMemAlloc's memory is not.
	require.Equal(t, make([]byte, 4<<20), f.peek(devptr(b.Addr()), 4<<20))
	_, err = b.WriteAt([]byte("x"), 3<<20+1)
	require.ErrorIs(t, err, gpu.ErrInvalidSize, "past Size, inside the allocation")
	require.NoError(t, a.Free())
	require.NoError(t, b.Free())
	require.Zero(t, d.MemInfo().Used)
}

func TestOutOfMemoryLeaksNothing(t *testing.T) {
	f, devs := openFake(t, 1, 4<<20)
	d := devs[0]
	_, err := d.Alloc(0, 1)
	require.ErrorIs(t, err, gpu.ErrInvalidSize)

	// The cap: 3 MiB takes 4 MiB, so even a byte more needs memory past it.
	a, err := d.Alloc(3<<20, 1)
	require.NoError(t, err)
	_, err = d.Alloc(1, 1)
	require.ErrorIs(t, err, gpu.ErrOutOfMemory)
	_, err = d.Alloc(5<<20, 1)
	require.ErrorIs(t, err, gpu.ErrOutOfMemory)
	require.EqualValues(t, 4<<20, d.MemInfo().Used)
	require.NoError(t, a.Free())

	// The driver's own OOM (other processes hold the memory): named,
	// matched, nothing held.
	require.NoError(t, d.SetMaxMemory(0))
	f.mu.Lock()
	f.others = fakeGPU - 4<<20
	f.mu.Unlock()
	_, err = d.Alloc(6<<20, 1)
	require.ErrorIs(t, err, gpu.ErrOutOfMemory)
	var ce *Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "CUDA_ERROR_OUT_OF_MEMORY", ce.Name)
	require.Zero(t, d.MemInfo().Used)
	require.Empty(t, f.state().allocs)

	// Export and zeroing failures free what was allocated.
	for _, op := range []string{"cuIpcGetMemHandle", "cuMemsetD8Async"} {
		for _, n := range []int64{4096, 3 << 20} {
			f.setFail(op, 999)
			_, err = d.Alloc(n, 1)
			require.ErrorContains(t, err, op)
			require.ErrorContains(t, err, "CUDA_ERROR_UNKNOWN")
			require.NotErrorIs(t, err, gpu.ErrOutOfMemory)
			f.setFail(op, success)
			require.Zero(t, d.MemInfo().Used, "%s failing for %d bytes", op, n)
			require.Empty(t, f.state().allocs, "%s failing for %d bytes", op, n)
		}
	}
	// An arena that still holds a buffer survives a failed carve from it.
	keep, err := d.Alloc(4096, 1)
	require.NoError(t, err)
	f.setFail("cuMemsetD8Async", 999)
	_, err = d.Alloc(4096, 1)
	require.Error(t, err)
	f.setFail("cuMemsetD8Async", success)
	require.EqualValues(t, ArenaSize, d.MemInfo().Used)
	again, err := d.Alloc(4096, 1)
	require.NoError(t, err)
	require.EqualValues(t, 4096, again.Offset(), "the failed carve's range was returned")
	require.NoError(t, keep.Free())
	require.NoError(t, again.Free())
}

func TestMemoryOverhead64K(t *testing.T) {
	f := newFake(1, 1<<30)
	gd, err := open(f, 0)
	require.NoError(t, err)
	d := gd[0].(*Device)
	d.linger = 0
	defer d.Close()
	var bufs []gpu.Buffer
	for range 4096 {
		b, err := d.Alloc(64<<10, 1)
		require.NoError(t, err)
		bufs = append(bufs, b)
	}
	ratio := float64(d.MemInfo().Used) / float64(4096*64<<10)
	t.Logf("4096 x 64 KiB: %d bytes held, overhead %.3fx", d.MemInfo().Used, ratio)
	require.LessOrEqual(t, ratio, 1.1)
	for _, b := range bufs {
		require.NoError(t, b.Free())
	}
	require.Zero(t, d.MemInfo().Used)
	require.Empty(t, f.state().allocs)
}

func TestReadWriteRoundTrips(t *testing.T) {
	f, devs := openFake(t, 1, 0)
	d := devs[0]
	for _, size := range []int64{1, 100, 64<<10 + 3, 1 << 20, 3<<20 + 7, 9 << 20} {
		b, err := d.Alloc(size, 1)
		require.NoError(t, err)
		for _, off := range []int64{0, 1, size / 3} {
			n := size - off
			if n == 0 {
				continue
			}
			p := pattern(int(n), byte(off))
			w, err := b.WriteAt(p, off)
			require.NoError(t, err)
			require.EqualValues(t, n, w)
			// Straight from the fake's memory: the write landed where it should.
			require.Equal(t, p, f.peek(devptr(b.Addr())+devptr(off), n), "size %d off %d", size, off)
			got := make([]byte, n)
			r, err := b.ReadAt(got, off)
			require.NoError(t, err)
			require.EqualValues(t, n, r)
			require.Equal(t, p, got, "size %d off %d", size, off)
		}
		_, err = b.ReadAt(make([]byte, 2), size-1)
		require.ErrorIs(t, err, gpu.ErrInvalidSize)
		_, err = b.WriteAt([]byte{1}, -1)
		require.ErrorIs(t, err, gpu.ErrInvalidSize)
		n, err := b.ReadAt(nil, size)
		require.NoError(t, err)
		require.Zero(t, n)

		require.NoError(t, b.Zero(0, size/2))
		got := make([]byte, size)
		_, err = b.ReadAt(got, 0)
		require.NoError(t, err)
		require.Equal(t, make([]byte, size/2), got[:size/2])
		require.ErrorIs(t, b.Zero(size, 1), gpu.ErrInvalidSize)

		require.NoError(t, b.Free())
		require.ErrorIs(t, b.Free(), gpu.ErrFreed)
		_, err = b.ReadAt(got[:1], 0)
		require.ErrorIs(t, err, gpu.ErrFreed)
		_, err = b.WriteAt(got[:1], 0)
		require.ErrorIs(t, err, gpu.ErrFreed)
		require.ErrorIs(t, b.Zero(0, 1), gpu.ErrFreed)
	}
}

func TestDriverErrorsOnIO(t *testing.T) {
	f, devs := openFake(t, 1, 0)
	b, err := devs[0].Alloc(3<<20, 1)
	require.NoError(t, err)
	defer b.Free()
	f.setFail("cuMemcpyDtoHAsync_v2", 700)
	_, err = b.ReadAt(make([]byte, 2<<20), 0)
	var ce *Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "CUDA_ERROR_ILLEGAL_ADDRESS", ce.Name)
	f.setFail("cuMemcpyDtoHAsync_v2", success)
	f.setFail("cuStreamSynchronize", 999)
	_, err = b.WriteAt(make([]byte, 2<<20), 0)
	require.ErrorContains(t, err, "cuStreamSynchronize: CUDA_ERROR_UNKNOWN (999)")
	f.setFail("cuStreamSynchronize", success)
}

func TestCopyPaths(t *testing.T) {
	f, devs := openFake(t, 2, 0)
	d0, d1 := devs[0], devs[1]
	src, err := d0.Alloc(5<<20, 1)
	require.NoError(t, err)
	defer src.Free()
	p := pattern(5<<20, 3)
	_, err = src.WriteAt(p, 0)
	require.NoError(t, err)

	check := func(b gpu.Buffer, off int64, want []byte) {
		t.Helper()
		got := make([]byte, len(want))
		_, err := b.ReadAt(got, off)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}

	// Same device: cuMemcpyDtoD.
	same, err := d0.Alloc(1<<20, 1)
	require.NoError(t, err)
	defer same.Free()
	done, err := same.(*buffer).CopyFrom(100, src, 1000, 4000)
	require.True(t, done)
	require.NoError(t, err)
	check(same, 100, p[1000:5000])
	require.Equal(t, 1, f.calls["cuMemcpyDtoDAsync_v2"])

	// Another device: cuMemcpyPeer, peer access enabled once.
	other, err := d1.Alloc(5<<20, 1)
	require.NoError(t, err)
	defer other.Free()
	for range 3 {
		done, err = other.(*buffer).CopyFrom(0, src, 0, 5<<20)
		require.True(t, done)
		require.NoError(t, err)
	}
	check(other, 0, p)
	require.Equal(t, 3, f.calls["cuMemcpyPeerAsync"])
	require.Equal(t, 1, f.calls["cuCtxEnablePeerAccess"])
	require.Equal(t, 1, f.peerOn[[2]cuCtx{fakeCtx(1), fakeCtx(0)}])

	// Host to CUDA and back, straight through the staging buffers.
	h, err := gpu.NewHost(16 << 20)
	require.NoError(t, err)
	hb, err := h.Alloc(3<<20, 0)
	require.NoError(t, err)
	defer hb.Free()
	hp := pattern(3<<20, 77)
	_, err = hb.WriteAt(hp, 0)
	require.NoError(t, err)
	done, err = other.(*buffer).CopyFrom(5, hb, 7, 3<<20-7)
	require.True(t, done)
	require.NoError(t, err)
	check(other, 5, hp[7:])
	done, err = src.(*buffer).CopyTo(0, hb, 1, 3<<20-1)
	require.True(t, done)
	require.NoError(t, err)
	check(hb, 1, p[:3<<20-1])

	// Ranges, and a source of another driver is left to the generic path.
	_, err = same.(*buffer).CopyFrom(1, src, 0, 1<<20)
	require.ErrorIs(t, err, gpu.ErrInvalidSize)
	_, foreign := openFake(t, 1, 0)
	fb, err := foreign[0].Alloc(10, 1)
	require.NoError(t, err)
	defer fb.Free()
	done, err = same.(*buffer).CopyFrom(0, fb, 0, 10)
	require.False(t, done)
	require.NoError(t, err)

	// gpu.Copy works today through the generic path, whatever the hook.
	want := make([]byte, 1<<20)
	_, err = other.ReadAt(want, 0)
	require.NoError(t, err)
	require.NoError(t, gpu.Copy(same, 0, other, 0, 1<<20))
	check(same, 0, want)
}

func TestPeerAccessRefusedStillCopies(t *testing.T) {
	f, devs := openFake(t, 2, 0)
	f.canPeer = false
	a, err := devs[0].Alloc(4096, 1)
	require.NoError(t, err)
	defer a.Free()
	b, err := devs[1].Alloc(4096, 1)
	require.NoError(t, err)
	defer b.Free()
	_, err = a.WriteAt([]byte("peer"), 0)
	require.NoError(t, err)
	done, err := b.(*buffer).CopyFrom(0, a, 0, 4)
	require.True(t, done)
	require.NoError(t, err)
	got := make([]byte, 4)
	_, err = b.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, "peer", string(got))
	require.Zero(t, f.calls["cuCtxEnablePeerAccess"])
}

// TestConcurrentContextDiscipline runs I/O on two GPUs from many goroutines:
// the fake records any driver call made on a thread whose current context
// is not the one the call needs (a goroutine that moved threads between
// cuCtxSetCurrent and the call would do that).
func TestConcurrentContextDiscipline(t *testing.T) {
	f, devs := openFake(t, 2, 0)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 16 {
		wg.Go(func() {
			d := devs[g%2]
			for i := range 20 {
				size := int64(1+i*4099) % (3 << 20)
				if size == 0 {
					size = 1
				}
				b, err := d.Alloc(size, uint32(g%3))
				if err != nil {
					errs <- err
					return
				}
				p := pattern(int(size), byte(g))
				if _, err := b.WriteAt(p, 0); err != nil {
					errs <- err
				}
				got := make([]byte, size)
				if _, err := b.ReadAt(got, 0); err != nil {
					errs <- err
				}
				if !bytes.Equal(p, got) {
					errs <- fmt.Errorf("goroutine %d: %d bytes read back differ", g, size)
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
	require.Empty(t, f.state().violations)
	require.Zero(t, devs[0].MemInfo().Used)
	require.Zero(t, devs[1].MemInfo().Used)
	require.LessOrEqual(t, devs[0].nstagers, maxStagers)
}

func TestCloseReportsLeaks(t *testing.T) {
	f := newFake(1, fakeGPU)
	gd, err := open(f, 0)
	require.NoError(t, err)
	d := gd[0]
	_, err = d.Alloc(100, 1)
	require.NoError(t, err)
	require.ErrorContains(t, d.Close(), "still allocated")
	require.NoError(t, d.Close(), "a second Close does nothing")
	s := f.state()
	require.Zero(t, s.retained)
	require.Zero(t, s.host)
	require.Empty(t, s.allocs, "the context's release took its memory")
	_, err = d.Alloc(100, 1)
	require.ErrorIs(t, err, gpu.ErrFreed)
}

func TestChunkSize(t *testing.T) {
	require.EqualValues(t, 64<<10, chunkSize(1))
	require.EqualValues(t, 256<<10, chunkSize(1<<20))
	require.EqualValues(t, stageSize, chunkSize(64<<20))
	for _, n := range []int64{1, 4095, 1<<20 - 4096, 1 << 30} {
		c := chunkSize(n)
		require.LessOrEqual(t, c, int64(stageSize))
		require.LessOrEqual(t, (n+c-1)/c, max(4, n/stageSize+1))
	}
}

func TestArenaLinger(t *testing.T) {
	f, devs := openFake(t, 1, 0)
	d := devs[0]
	d.linger = 50 * time.Millisecond
	a, err := d.Alloc(64<<10, 1)
	require.NoError(t, err)
	id := a.ID()
	require.NoError(t, a.Free())
	require.EqualValues(t, ArenaSize, d.MemInfo().Used, "the empty arena lingers, and counts")
	allocs := f.calls["cuMemAlloc_v2"]
	for range 100 { // a create/unlink loop reuses it
		b, err := d.Alloc(64<<10, 1)
		require.NoError(t, err)
		require.Equal(t, id, b.ID())
		require.NoError(t, b.Free())
	}
	require.Equal(t, allocs, f.calls["cuMemAlloc_v2"])

	// Only one idle arena per owner: a second empty one is freed at once.
	var bufs []gpu.Buffer
	for range 33 {
		b, err := d.Alloc(64<<10, 1)
		require.NoError(t, err)
		bufs = append(bufs, b)
	}
	require.EqualValues(t, 2*ArenaSize, d.MemInfo().Used)
	for _, b := range bufs {
		require.NoError(t, b.Free())
	}
	require.EqualValues(t, ArenaSize, d.MemInfo().Used)
	require.Eventually(t, func() bool { return d.MemInfo().Used == 0 }, 2*time.Second, 10*time.Millisecond)
	require.Empty(t, f.state().allocs)

	// Close frees an idle arena without waiting, and reports no leak.
	d.linger = time.Hour
	b, err := d.Alloc(100, 2)
	require.NoError(t, err)
	require.NoError(t, b.Free())
	require.EqualValues(t, ArenaSize, d.MemInfo().Used)
	require.NoError(t, d.Close())
	require.Empty(t, f.state().allocs)
}

// TestLingeringArenasNeverCostENOSPC: an idle arena counts against the cap,
// so an allocation that does not fit frees idle arenas and tries again.
func TestLingeringArenasNeverCostENOSPC(t *testing.T) {
	_, devs := openFake(t, 1, 4<<20)
	d := devs[0]
	d.linger = time.Hour
	idle := func(owner uint32) {
		b, err := d.Alloc(4096, owner)
		require.NoError(t, err)
		require.NoError(t, b.Free())
	}
	idle(1)
	idle(2)
	require.EqualValues(t, 4<<20, d.MemInfo().Used, "two idle arenas fill the cap")
	big, err := d.Alloc(3<<20, 3)
	require.NoError(t, err, "a large buffer reclaims them")
	require.EqualValues(t, 4<<20, d.MemInfo().Used)
	require.NoError(t, big.Free())

	idle(1)
	keep, err := d.Alloc(4096, 2)
	require.NoError(t, err)
	small, err := d.Alloc(4096, 3)
	require.NoError(t, err, "a new arena reclaims owner 1's idle one")
	require.EqualValues(t, 4<<20, d.MemInfo().Used)
	require.NoError(t, keep.Free())
	require.NoError(t, small.Free())
	_, err = d.flushIdle()
	require.NoError(t, err)
	require.Zero(t, d.MemInfo().Used)
}

// TestWholeAllocationsRecycled: a freed whole allocation is kept for the
// linger and handed to the next allocation of the same size and owner
// (zeroed, a new allocation id), without cuMemFree/cuMemAlloc; another
// size or owner gets its own; the spare is freed after the linger, and at
// once when memory runs short.
func TestWholeAllocationsRecycled(t *testing.T) {
	f, devs := openFake(t, 1, 0)
	d := devs[0]
	d.linger = time.Hour
	const size = 4 * ArenaSize
	a, err := d.Alloc(size, 7)
	require.NoError(t, err)
	_, err = a.WriteAt([]byte("old bytes"), 0)
	require.NoError(t, err)
	addr, id, handle := a.Addr(), a.ID(), a.Handle()
	require.NoError(t, a.Free())
	require.EqualValues(t, size, d.MemInfo().Used, "the spare lingers, and counts")
	f.mu.Lock()
	allocs := f.calls["cuMemAlloc_v2"]
	f.mu.Unlock()

	b, err := d.Alloc(size, 7)
	require.NoError(t, err)
	require.Equal(t, addr, b.Addr(), "the spare was reused")
	require.Equal(t, handle, b.Handle())
	require.NotEqual(t, id, b.ID(), "a new allocation id: importers must not take it for the old one")
	f.mu.Lock()
	require.Equal(t, allocs, f.calls["cuMemAlloc_v2"], "no cuMemAlloc")
	f.mu.Unlock()
	p := make([]byte, 9)
	_, err = b.ReadAt(p, 0)
	require.NoError(t, err)
	require.Equal(t, make([]byte, 9), p, "zeroed")

	c, err := d.Alloc(size, 8)
	require.NoError(t, err)
	require.NotEqual(t, addr, c.Addr(), "another owner never gets the spare")
	require.NoError(t, c.Free())
	require.NoError(t, b.Free())
	require.EqualValues(t, 2*size, d.MemInfo().Used)
	n, err := d.flushIdle()
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Zero(t, d.MemInfo().Used)

	d.linger = 20 * time.Millisecond
	e, err := d.Alloc(size, 7)
	require.NoError(t, err)
	require.NoError(t, e.Free())
	require.Eventually(t, func() bool { return d.MemInfo().Used == 0 }, time.Second, 5*time.Millisecond, "freed after the linger")
}

// TestAllocUninit: a whole allocation recycled for its owner keeps its
// first nbytes as they were and has its tail (which an import of the
// allocation reaches) cleared; a fresh allocation and an arena piece are
// zeroed as by Alloc.
func TestAllocUninit(t *testing.T) {
	_, devs := openFake(t, 1, 0)
	d := devs[0]
	d.linger = time.Hour
	const size = 4 * ArenaSize
	a, err := d.Alloc(size, 7)
	require.NoError(t, err)
	_, err = a.WriteAt(bytes.Repeat([]byte{0xa5}, size), 0)
	require.NoError(t, err)
	addr := a.Addr()
	require.NoError(t, a.Free())

	const n = size - 4096 // its tail is in the allocation: cleared
	b, err := gpu.AllocUninit(d, n, 7)
	require.NoError(t, err)
	require.Equal(t, addr, b.Addr(), "the spare was reused")
	p := make([]byte, 4)
	_, err = b.ReadAt(p, 0)
	require.NoError(t, err)
	require.Equal(t, []byte{0xa5, 0xa5, 0xa5, 0xa5}, p, "not cleared")
	tail := make([]byte, 4096)
	require.NoError(t, d.dtoh(tail, b.(*buffer).a.base+devptr(n)))
	require.Equal(t, make([]byte, 4096), tail, "the tail past nbytes is cleared")
	require.NoError(t, b.Free())

	fresh, err := d.AllocUninit(size, 8)
	require.NoError(t, err)
	require.NotEqual(t, addr, fresh.Addr())
	_, err = fresh.ReadAt(p, 0)
	require.NoError(t, err)
	require.Equal(t, make([]byte, 4), p, "fresh memory is zeroed")
	require.NoError(t, fresh.Free())

	piece, err := d.Alloc(64<<10, 9)
	require.NoError(t, err)
	_, err = piece.WriteAt([]byte{1, 2, 3, 4}, 0)
	require.NoError(t, err)
	require.NoError(t, piece.Free())
	again, err := d.AllocUninit(64<<10, 9)
	require.NoError(t, err)
	_, err = again.ReadAt(p, 0)
	require.NoError(t, err)
	require.Equal(t, make([]byte, 4), p, "arena pieces are zeroed")
	require.NoError(t, again.Free())
}
