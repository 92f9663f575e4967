package cuda

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/gpu"
)

// setBatch sets the copy-engine threshold and the descriptors per launch
// for one test.
func setBatch(t *testing.T, engineMin int64, descMax int) {
	t.Helper()
	oldMin, oldMax := batchEngineMin, batchDescMax
	batchEngineMin, batchDescMax = engineMin, descMax
	t.Cleanup(func() { batchEngineMin, batchDescMax = oldMin, oldMax })
}

// layout makes one extent per size, in a shuffled order, laid end to end in
// a destination (so neighbours are adjacent and offsets unsorted by size),
// each from a random offset of a source chosen by pick. It returns the
// extents and the destination bytes they need.
func layout(rng *rand.Rand, dst gpu.Buffer, sizes []int64, pick func(i int) gpu.Buffer) []gpu.Extent {
	order := rng.Perm(len(sizes))
	exts := make([]gpu.Extent, len(sizes))
	off := int64(0)
	for _, i := range order {
		src := pick(i)
		exts[i] = gpu.Extent{Dst: dst, DstOff: off, Src: src, SrcOff: rng.Int64N(src.Size() - sizes[i] + 1), N: sizes[i]}
		off += sizes[i]
	}
	return exts
}

// expect applies exts in Go to a copy of want, reading sources from srcs.
func expect(want []byte, exts []gpu.Extent, srcs map[gpu.Buffer][]byte) []byte {
	want = bytes.Clone(want)
	for _, e := range exts {
		copy(want[e.DstOff:e.DstOff+e.N], srcs[e.Src][e.SrcOff:e.SrcOff+e.N])
	}
	return want
}

func filled(t *testing.T, d *Device, n int64, seed byte) (gpu.Buffer, []byte) {
	t.Helper()
	b, err := d.Alloc(n, 0)
	require.NoError(t, err)
	t.Cleanup(func() { b.Free() })
	p := pattern(int(n), seed)
	_, err = b.WriteAt(p, 0)
	require.NoError(t, err)
	return b, p
}

// TestCopyBatchOneLaunch: sizes from 1 byte to past the threshold, from a
// buffer of the device, an arena piece, imports of memory on this GPU and
// on the other, and a peer GPU's buffer, into one destination: the small
// extents are one launch, the large ones copy-engine calls (DtoD, or peer
// from the other GPU's buffer), and one synchronization waits for all.
func TestCopyBatchOneLaunch(t *testing.T) {
	f, devs := openFake(t, 2, 0)
	setBatch(t, 256<<10, batchDescMax)
	d := devs[0]
	rng := rand.New(rand.NewPCG(1, 2))

	own, ownB := filled(t, d, 3<<20, 1)
	piece, pieceB := filled(t, d, 300<<10, 2) // an arena piece
	peerBuf, peerB := filled(t, devs[1], 2<<20, 3)
	h0, _, imp0B := foreign(t, f, 0, 3<<20, 4)
	h1, _, imp1B := foreign(t, f, 1, 2<<20, 5)
	imp0, err := d.Import(h0, 0, 0)
	require.NoError(t, err)
	defer imp0.Free()
	imp1, err := d.Import(h1, 4096, 0) // cuda:1 memory mapped in cuda:0's context
	require.NoError(t, err)
	defer imp1.Free()
	srcs := []gpu.Buffer{own, piece, peerBuf, imp0, imp1}
	bytesOf := map[gpu.Buffer][]byte{own: ownB, piece: pieceB, peerBuf: peerB, imp0: imp0B, imp1: imp1B[4096:]}

	sizes := []int64{1, 2, 3, 15, 16, 17, 31, 4095, 4096, 8192, 65535, 65536, 65537, 200000, 256<<10 - 1, 256 << 10, 1<<20 + 3}
	for range 40 {
		sizes = append(sizes, 1+rng.Int64N(20000))
	}
	var total int64
	for _, n := range sizes {
		total += n
	}
	dst, err := d.Alloc(total+1000, 0)
	require.NoError(t, err)
	defer dst.Free()
	exts := layout(rng, dst, sizes, func(i int) gpu.Buffer {
		switch {
		case sizes[i] == 256<<10:
			return peerBuf // a large extent from the peer GPU: cuMemcpyPeerAsync
		case sizes[i] > 1<<20:
			return imp1 // a large extent from an import
		case sizes[i] > piece.Size():
			return own
		}
		return srcs[i%len(srcs)]
	})
	exts = append(exts, gpu.Extent{Dst: dst, DstOff: 5, Src: own, SrcOff: 7}) // empty: copies nothing
	before := readAll(t, dst)
	want := expect(before, exts, bytesOf)

	var small, dtod, peer int
	for _, e := range exts {
		switch {
		case e.N == 0:
		case e.N < batchEngineMin:
			small += int((e.N + batchPiece - 1) / batchPiece)
		case e.Src == peerBuf:
			peer++
		default:
			dtod++
		}
	}
	dtod0, peer0, sync0 := f.count("cuMemcpyDtoDAsync_v2"), f.count("cuMemcpyPeerAsync"), f.count("cuStreamSynchronize")
	require.NoError(t, gpu.CopyBatch(exts))
	require.Equal(t, []int{small}, f.launched(), "one launch for every small extent")
	require.Equal(t, dtod, f.count("cuMemcpyDtoDAsync_v2")-dtod0, "large extents: one copy-engine call each")
	require.Equal(t, peer, f.count("cuMemcpyPeerAsync")-peer0)
	require.Equal(t, 1, f.count("cuStreamSynchronize")-sync0, "one synchronization")
	require.True(t, bytes.Equal(want, readAll(t, dst)), "every byte of the batch")
	require.Equal(t, 1, f.count("cuModuleLoadData"))

	// A second batch reuses the module, and its descriptor arrays.
	alloc0 := f.count("cuMemAlloc_v2")
	exts2 := layout(rng, dst, sizes[:10], func(i int) gpu.Buffer { return own })
	want = expect(want, exts2, bytesOf)
	require.NoError(t, gpu.CopyBatch(exts2))
	require.True(t, bytes.Equal(want, readAll(t, dst)))
	require.Equal(t, 1, f.count("cuModuleLoadData"))
	require.Equal(t, alloc0, f.count("cuMemAlloc_v2"))
	require.Len(t, f.launched(), 2)
}

// TestCopyBatchManyLaunches: more descriptors than one staging buffer
// holds take several launches, alternating buffers; the fake runs each
// kernel only at synchronization, reading its descriptors from the staging
// buffer then, so refilling a buffer before its kernel ran would show as
// wrong bytes.
func TestCopyBatchManyLaunches(t *testing.T) {
	_, devs := openFake(t, 1, 0)
	setBatch(t, 1<<20, 5)
	d := devs[0]
	rng := rand.New(rand.NewPCG(3, 4))
	src, srcB := filled(t, d, 1<<20, 7)
	dst, err := d.Alloc(1<<20, 0)
	require.NoError(t, err)
	defer dst.Free()
	var sizes []int64
	for range 21 {
		sizes = append(sizes, 1+rng.Int64N(3000))
	}
	sizes = append(sizes, 3*batchPiece) // three descriptors
	exts := layout(rng, dst, sizes, func(int) gpu.Buffer { return src })
	want := expect(readAll(t, dst), exts, map[gpu.Buffer][]byte{src: srcB})
	f := d.drv.(*fakeDriver)
	require.NoError(t, gpu.CopyBatch(exts))
	require.Equal(t, []int{5, 5, 5, 5, 4}, f.launched())
	require.True(t, bytes.Equal(want, readAll(t, dst)))
}

// TestCopyBatchRangeErrorsCopyNothing: one bad extent anywhere in the batch
// fails it with ErrInvalidSize before any byte moves, through gpu.CopyBatch
// and through the BatchCopier itself.
func TestCopyBatchRangeErrorsCopyNothing(t *testing.T) {
	f, devs := openFake(t, 1, 0)
	d := devs[0]
	src, _ := filled(t, d, 64<<10, 1)
	dst, err := d.Alloc(64<<10, 0)
	require.NoError(t, err)
	defer dst.Free()
	good := gpu.Extent{Dst: dst, DstOff: 0, Src: src, SrcOff: 0, N: 4096}
	bad := []gpu.Extent{
		{Dst: dst, DstOff: 64<<10 - 10, Src: src, SrcOff: 0, N: 11},
		{Dst: dst, DstOff: 0, Src: src, SrcOff: 64 << 10, N: 1},
		{Dst: dst, DstOff: -1, Src: src, SrcOff: 0, N: 1},
		{Dst: dst, DstOff: 0, Src: src, SrcOff: 0, N: -1},
		{Dst: dst, DstOff: 1 << 62, Src: src, SrcOff: 0, N: 1 << 62}, // a sum that wraps
	}
	for i, e := range bad {
		exts := []gpu.Extent{good, good, e, good}
		exts[1].DstOff = 8192
		require.ErrorIs(t, gpu.CopyBatch(exts), gpu.ErrInvalidSize, "bad extent %d", i)
		done, err := dst.(*buffer).CopyBatch(exts)
		require.True(t, done)
		require.ErrorIs(t, err, gpu.ErrInvalidSize, "bad extent %d, direct", i)
	}
	require.Empty(t, f.launched(), "nothing launched")
	require.Zero(t, f.count("cuMemcpyDtoDAsync_v2"))
	require.True(t, bytes.Equal(make([]byte, 64<<10), readAll(t, dst)), "not one byte written")
	require.NoError(t, gpu.CopyBatch(nil))
}

// TestCopyBatchDeclines: a source the kernel cannot address (host memory,
// a GPU without peer access) or a destination on another device sends the
// batch down the generic path, which still copies every byte.
func TestCopyBatchDeclines(t *testing.T) {
	f, devs := openFake(t, 2, 0)
	f.canPeer = false
	d := devs[0]
	own, ownB := filled(t, d, 64<<10, 1)
	other, otherB := filled(t, devs[1], 64<<10, 2)
	host, err := gpu.NewHost(1 << 30)
	require.NoError(t, err)
	defer host.Close()
	hb, err := host.Alloc(64<<10, 0)
	require.NoError(t, err)
	defer hb.Free()
	hostB := pattern(64<<10, 3)
	_, err = hb.WriteAt(hostB, 0)
	require.NoError(t, err)
	dst, err := d.Alloc(64<<10, 0)
	require.NoError(t, err)
	defer dst.Free()
	dst1, err := devs[1].Alloc(64<<10, 0)
	require.NoError(t, err)
	defer dst1.Free()
	bytesOf := map[gpu.Buffer][]byte{own: ownB, other: otherB, hb: hostB}

	for _, tc := range []struct {
		name string
		exts []gpu.Extent
	}{
		{"host source", []gpu.Extent{{Dst: dst, Src: own, N: 100}, {Dst: dst, DstOff: 100, Src: hb, SrcOff: 5, N: 1000}}},
		{"no peer access", []gpu.Extent{{Dst: dst, Src: own, N: 100}, {Dst: dst, DstOff: 100, Src: other, SrcOff: 5, N: 1000}}},
		{"two destination devices", []gpu.Extent{{Dst: dst, Src: own, N: 100}, {Dst: dst1, DstOff: 100, Src: other, SrcOff: 5, N: 1000}}},
	} {
		done, err := tc.exts[0].Dst.(*buffer).CopyBatch(tc.exts)
		require.False(t, done, tc.name)
		require.NoError(t, err)
		wantD := expect(readAll(t, dst), tc.exts[:1], bytesOf)
		require.NoError(t, gpu.CopyBatch(tc.exts), tc.name)
		require.True(t, bytes.Equal(wantD[:100], readAll(t, dst)[:100]), tc.name)
		last := tc.exts[1]
		require.True(t, bytes.Equal(bytesOf[last.Src][5:1005], readAll(t, last.Dst)[100:1100]), tc.name)
	}
	require.Empty(t, f.launched(), "generic path only")
}

// TestCopyBatchWithoutKernel: a module the driver refuses (a PTX newer
// than the driver) leaves every extent to the copy engine, still one
// stream and one synchronization; it is tried once per device.
func TestCopyBatchWithoutKernel(t *testing.T) {
	f, devs := openFake(t, 1, 0)
	f.setFail("cuModuleLoadData", 222) // CUDA_ERROR_UNSUPPORTED_PTX_VERSION
	d := devs[0]
	src, srcB := filled(t, d, 64<<10, 1)
	dst, err := d.Alloc(64<<10, 0)
	require.NoError(t, err)
	defer dst.Free()
	exts := layout(rand.New(rand.NewPCG(5, 6)), dst, []int64{1, 100, 5000, 17}, func(int) gpu.Buffer { return src })
	want := expect(readAll(t, dst), exts, map[gpu.Buffer][]byte{src: srcB})
	for range 2 {
		sync0 := f.count("cuStreamSynchronize")
		require.NoError(t, gpu.CopyBatch(exts))
		require.Equal(t, 1, f.count("cuStreamSynchronize")-sync0)
	}
	require.True(t, bytes.Equal(want, readAll(t, dst)))
	require.Empty(t, f.launched())
	require.Equal(t, 8, f.count("cuMemcpyDtoDAsync_v2"))
	require.Equal(t, 1, f.count("cuModuleLoadData"))
}

// TestCopyBatchErrors: a freed buffer is ErrFreed with nothing copied; a
// failed launch is the driver's error, and the stream is drained (the
// fake's cleanup refuses to destroy a busy stream).
func TestCopyBatchErrors(t *testing.T) {
	f, devs := openFake(t, 1, 0)
	d := devs[0]
	src, _ := filled(t, d, 64<<10, 1)
	dst, err := d.Alloc(64<<10, 0)
	require.NoError(t, err)
	defer dst.Free()
	gone, err := d.Alloc(4096, 0)
	require.NoError(t, err)
	require.NoError(t, gone.Free())
	exts := []gpu.Extent{{Dst: dst, Src: src, N: 100}, {Dst: dst, DstOff: 100, Src: gone, N: 100}}
	require.ErrorIs(t, gpu.CopyBatch(exts), gpu.ErrFreed)
	require.True(t, bytes.Equal(make([]byte, 200), readAll(t, dst)[:200]))

	f.setFail("cuLaunchKernel", 719)
	err = gpu.CopyBatch(exts[:1])
	var ce *Error
	require.True(t, errors.As(err, &ce), "%v", err)
	require.Equal(t, "cuLaunchKernel", ce.Op)
	f.setFail("cuLaunchKernel", success)
	require.NoError(t, gpu.CopyBatch(exts[:1]))
}

// TestCopyBatchConcurrent runs batches on one device from several
// goroutines (the race detector watches the kernel's lazy load and the
// stagers' descriptor arrays).
func TestCopyBatchConcurrent(t *testing.T) {
	_, devs := openFake(t, 1, 0)
	d := devs[0]
	src, srcB := filled(t, d, 256<<10, 9)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		dst, err := d.Alloc(64<<10, 0)
		require.NoError(t, err)
		defer dst.Free()
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range 5 {
				exts := layout(rng, dst, []int64{10, 4096, 3000, 1}, func(int) gpu.Buffer { return src })
				want := expect(make([]byte, 64<<10), exts, map[gpu.Buffer][]byte{src: srcB})
				if err := gpu.CopyBatch(exts); err != nil {
					errs <- err
					return
				}
				got := make([]byte, 64<<10)
				dst.ReadAt(got, 0)
				if !bytes.Equal(want[:8107], got[:8107]) {
					errs <- errors.New("batch bytes differ")
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// nopDriver is the fake with the calls of a batch's hot path made free
// (no context switch, upload, launch or synchronization happens), to
// measure the Go side of CopyBatch alone.
type nopDriver struct{ *fakeDriver }

func (nopDriver) ctxSetCurrent(cuCtx) result { return success }

func (nopDriver) memcpyHtoDAsync(devptr, unsafe.Pointer, uint64, cuStrm) result { return success }

func (nopDriver) streamSynchronize(cuStrm) result { return success }

func (nopDriver) launchKernel(cuFunc, [3]uint32, [3]uint32, uint32, cuStrm, unsafe.Pointer) result {
	return success
}

// BenchmarkCopyBatchGoSide: what gpu.CopyBatch costs the CPU for 1000
// extents of 8 KiB between two buffers (checks, locks, descriptors), with
// the driver's calls free; on a GPU the kernel adds its 14 µs.
func BenchmarkCopyBatchGoSide(b *testing.B) {
	exts := goSide(b)
	b.ReportAllocs()
	for b.Loop() {
		if err := gpu.CopyBatch(exts); err != nil {
			b.Fatal(err)
		}
	}
}

// goSide is the setup of the Go-side benchmarks: a fake device whose
// batch calls are free (nopDriver), its kernel loaded and a stager made,
// and 1000 scattered 8 KiB extents between two of its
// buffers; all undone at the benchmark's end.
func goSide(b *testing.B) []gpu.Extent {
	f := newFake(1, fakeGPU)
	gd, err := open(f, 0)
	require.NoError(b, err)
	d := gd[0].(*Device)
	x, err := d.Alloc(16<<20, 0)
	require.NoError(b, err)
	y, err := d.Alloc(16<<20, 0)
	require.NoError(b, err)
	_, ok := d.scatterKernel()
	require.True(b, ok)
	require.NoError(b, d.withStager(func(*stager) error { return nil }))
	d.drv = nopDriver{f}
	b.Cleanup(func() {
		d.drv = f
		x.Free()
		y.Free()
		require.NoError(b, d.Close())
	})
	return blockScatter(rand.New(rand.NewPCG(1, 1)), x, 0, y, 0, 1000, 8192)
}

// rangesOf is exts (all of one Dst and Src) as one range list.
func rangesOf(exts []gpu.Extent, dstLen int64) gpu.RangeList {
	return gpu.RangeList{Dst: exts[0].Dst, DstLen: dstLen, Src: exts[0].Src, N: len(exts), At: func(k int) (int64, int64, int64) {
		e := &exts[k]
		return e.SrcOff, e.DstOff, e.N
	}}
}

// TestCopyRanges: range lists from several sources (this device's buffer,
// an arena piece, an import, a peer GPU's buffer) into one destination run
// as one launch and one synchronization, byte for byte as the same extents
// through CopyBatch; a range past a list's DstLen, or outside a buffer, is
// ErrInvalidSize with nothing launched or written; lists the kernel cannot
// run (a host source) go through the generic path and still copy.
func TestCopyRanges(t *testing.T) {
	f, devs := openFake(t, 2, 0)
	setBatch(t, 256<<10, batchDescMax)
	d := devs[0]
	rng := rand.New(rand.NewPCG(7, 8))
	own, ownB := filled(t, d, 1<<20, 1)
	piece, pieceB := filled(t, d, 300<<10, 2)
	peerBuf, peerB := filled(t, devs[1], 1<<20, 3)
	h0, _, imp0B := foreign(t, f, 0, 1<<20, 4)
	imp0, err := d.Import(h0, 0, 0)
	require.NoError(t, err)
	defer imp0.Free()
	bytesOf := map[gpu.Buffer][]byte{own: ownB, piece: pieceB, peerBuf: peerB, imp0: imp0B}
	dst, err := d.Alloc(4<<20, 0)
	require.NoError(t, err)
	defer dst.Free()

	var lists []gpu.RangeList
	var all []gpu.Extent
	small := 0
	for i, src := range []gpu.Buffer{own, piece, imp0, peerBuf} {
		exts := blockScatter(rng, dst, int64(i)<<20, src, 0, 30, 8192)
		exts[3].N = 0         // an empty range copies nothing
		exts[4].N = 300 << 10 // past batchEngineMin here: the copy engine
		exts[4].SrcOff = 0
		exts[4].DstOff = int64(i)<<20 + 600<<10 // clear of the blocks (overlaps race)
		if src == piece {
			exts[4].N = 100
		}
		for _, e := range exts {
			if e.N > 0 && e.N < batchEngineMin {
				small += int((e.N + batchPiece - 1) / batchPiece)
			}
		}
		lists = append(lists, rangesOf(exts, dst.Size()))
		all = append(all, exts...)
	}
	want := expect(readAll(t, dst), all, bytesOf)
	sync0 := f.count("cuStreamSynchronize")
	require.NoError(t, gpu.CopyRanges(lists))
	require.Equal(t, []int{small}, f.launched(), "one launch for every small range")
	require.Equal(t, 1, f.count("cuStreamSynchronize")-sync0, "one synchronization")
	require.True(t, bytes.Equal(want, readAll(t, dst)), "every byte")

	// Refusals: nothing launched, nothing written.
	before := readAll(t, dst)
	launches := len(f.launched())
	good := blockScatter(rng, dst, 0, own, 0, 4, 4096)
	for i, bad := range []gpu.Extent{
		{Dst: dst, DstOff: 8192 - 10, Src: own, N: 11}, // past DstLen (8192)
		{Dst: dst, DstOff: 0, Src: own, SrcOff: 1 << 20, N: 1},
		{Dst: dst, DstOff: -1, Src: own, N: 1},
		{Dst: dst, DstOff: 0, Src: own, N: -1},
		{Dst: dst, DstOff: 1 << 62, Src: own, N: 1 << 62},
	} {
		ls := []gpu.RangeList{rangesOf(good, 1<<20), rangesOf([]gpu.Extent{good[0], bad}, 8192)}
		require.ErrorIs(t, gpu.CopyRanges(ls), gpu.ErrInvalidSize, "bad range %d", i)
		done, err := dst.(*buffer).CopyRanges(ls)
		require.True(t, done)
		require.ErrorIs(t, err, gpu.ErrInvalidSize, "bad range %d, direct", i)
	}
	require.Len(t, f.launched(), launches, "nothing launched")
	require.True(t, bytes.Equal(before, readAll(t, dst)), "not one byte written")

	// A host source: declined, then copied by the generic path.
	host, err := gpu.NewHost(1 << 30)
	require.NoError(t, err)
	defer host.Close()
	hb, err := host.Alloc(64<<10, 0)
	require.NoError(t, err)
	defer hb.Free()
	hostB := pattern(64<<10, 9)
	_, err = hb.WriteAt(hostB, 0)
	require.NoError(t, err)
	bytesOf[hb] = hostB
	mixed := []gpu.RangeList{rangesOf(blockScatter(rng, dst, 0, own, 0, 3, 1000), dst.Size()), rangesOf(blockScatter(rng, dst, 8192, hb, 0, 3, 1000), dst.Size())}
	done, err := dst.(*buffer).CopyRanges(mixed)
	require.False(t, done)
	require.NoError(t, err)
	var mixedExts []gpu.Extent
	for _, l := range mixed {
		for k := range l.N {
			s, dd, n := l.At(k)
			mixedExts = append(mixedExts, gpu.Extent{Dst: l.Dst, DstOff: dd, Src: l.Src, SrcOff: s, N: n})
		}
	}
	want = expect(readAll(t, dst), mixedExts, bytesOf)
	require.NoError(t, gpu.CopyRanges(mixed))
	require.True(t, bytes.Equal(want, readAll(t, dst)))
	require.NoError(t, gpu.CopyRanges(nil))
}

// BenchmarkCopyRangesGoSide: BenchmarkCopyBatchGoSide's 1000 x 8 KiB as
// one range list (gpu.CopyRanges, as an IPC copy's receiver runs it), and
// as the extents built from the same list first (how it ran before).
func BenchmarkCopyRangesGoSide(b *testing.B) {
	exts := goSide(b)
	x, y := exts[0].Dst, exts[0].Src
	type span struct{ src, dst, n int64 }
	spans := make([]span, len(exts))
	for i, e := range exts {
		spans[i] = span{e.SrcOff, e.DstOff, e.N}
	}
	list := []gpu.RangeList{{Dst: x, DstLen: 16 << 20, Src: y, N: len(spans), At: func(k int) (int64, int64, int64) {
		s := &spans[k]
		return s.src, s.dst, s.n
	}}}
	b.Run("ranges", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := gpu.CopyRanges(list); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("extents", func(b *testing.B) {
		b.ReportAllocs()
		g := make([]gpu.Extent, 0, len(spans))
		for b.Loop() {
			g = g[:0]
			l := list[0]
			for k := range l.N {
				s, dd, n := l.At(k)
				g = append(g, gpu.Extent{Dst: l.Dst, DstOff: dd, Src: l.Src, SrcOff: s, N: n})
			}
			if err := gpu.CopyBatch(g); err != nil {
				b.Fatal(err)
			}
		}
	})
}
