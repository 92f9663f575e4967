package cuda

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/gpu"
)

// ptxEnv names a PTX file that the test binary loads instead of the
// embedded scatter.ptx: a kernel compiled on the device machine can be
// tried without rebuilding the binary.
const ptxEnv = "TENSORFS_SCATTER_PTX"

func init() {
	if p := os.Getenv(ptxEnv); p != "" {
		b, err := os.ReadFile(p)
		if err != nil {
			panic(fmt.Sprintf("%s=%s: %v", ptxEnv, p, err))
		}
		scatterPTX = b
	}
}

// blockScatter is count extents of n bytes: block i of src (at srcBase)
// to a permuted block of dst (at dstBase), so that neither side is in order.
func blockScatter(rng *rand.Rand, dst gpu.Buffer, dstBase int64, src gpu.Buffer, srcBase int64, count int, n int64) []gpu.Extent {
	exts := make([]gpu.Extent, count)
	for i, j := range rng.Perm(count) {
		exts[i] = gpu.Extent{Dst: dst, DstOff: dstBase + int64(j)*n, Src: src, SrcOff: srcBase + int64(i)*n, N: n}
	}
	return exts
}

// checkBatch runs exts and compares every byte of dst with want (exts
// applied in Go to dst's bytes before, srcs giving the sources' bytes).
func checkBatch(t *testing.T, dst gpu.Buffer, exts []gpu.Extent, srcs map[gpu.Buffer][]byte) {
	t.Helper()
	before := readAll(t, dst)
	if srcs[dst] != nil {
		srcs[dst] = before
	}
	want := expect(before, exts, srcs)
	require.NoError(t, gpu.CopyBatch(exts))
	got := readAll(t, dst)
	if !bytes.Equal(want, got) {
		bad := 0
		for i := range want {
			if want[i] != got[i] {
				bad++
			}
		}
		t.Fatalf("%d of %d bytes differ", bad, len(want))
	}
}

// TestRealCopyBatch scatters 1000 blocks of 8 KiB within one allocation,
// then extents of 1 byte to past the copy-engine threshold at odd offsets
// (the kernel's byte path and its 16-byte path with a head and a tail,
// and the copy engine), checking every byte.
func TestRealCopyBatch(t *testing.T) {
	d := openReal(t)[0]
	_, ok := d.scatterKernel()
	require.True(t, ok, "the scatter kernel loads on this GPU: %v", d.kerr)
	rng := rand.New(rand.NewPCG(1, 2))
	t.Run("1000x8K-one-allocation", func(t *testing.T) {
		b, err := d.Alloc(16<<20, 0)
		require.NoError(t, err)
		defer b.Free()
		_, err = b.WriteAt(pattern(16<<20, 1), 0)
		require.NoError(t, err)
		exts := blockScatter(rng, b, 8<<20, b, 0, 1000, 8192)
		checkBatch(t, b, exts, map[gpu.Buffer][]byte{b: {}})
	})
	t.Run("mixed-sizes-and-alignments", func(t *testing.T) {
		src, err := d.Alloc(32<<20, 0)
		require.NoError(t, err)
		defer src.Free()
		srcB := pattern(32<<20, 2)
		_, err = src.WriteAt(srcB, 0)
		require.NoError(t, err)
		small, err := d.Alloc(100<<10, 0) // an arena piece
		require.NoError(t, err)
		defer small.Free()
		smallB := pattern(100<<10, 3)
		_, err = small.WriteAt(smallB, 0)
		require.NoError(t, err)
		dst, err := d.Alloc(96<<20, 0)
		require.NoError(t, err)
		defer dst.Free()
		var exts []gpu.Extent
		off := int64(3)
		add := func(s gpu.Buffer, n int64) {
			so := rng.Int64N(s.Size() - n + 1)
			exts = append(exts, gpu.Extent{Dst: dst, DstOff: off, Src: s, SrcOff: so, N: n})
			off += n + rng.Int64N(3) // adjacent, or a gap of one or two bytes
		}
		for _, n := range []int64{1, 2, 15, 16, 17, 4096, 65535, 65536, 65537, batchEngineMin - 1, batchEngineMin, batchEngineMin + 13} {
			add(src, n)
		}
		for range 500 {
			if rng.IntN(2) == 0 {
				add(small, 1+rng.Int64N(20000))
			} else {
				add(src, 1+rng.Int64N(100000))
			}
		}
		rng.Shuffle(len(exts), func(i, j int) { exts[i], exts[j] = exts[j], exts[i] })
		require.Less(t, off, dst.Size())
		checkBatch(t, dst, exts, map[gpu.Buffer][]byte{src: srcB, small: smallB})
	})
	t.Run("1000x8K-from-an-import", func(t *testing.T) {
		if os.Getenv(childEnv) != "" {
			t.Skip("in the exporting child")
		}
		c := startChild(t, 8<<20)
		imp, err := d.Import(c.bufs[0].handle, c.bufs[0].off, 8<<20)
		require.NoError(t, err)
		defer imp.Free()
		dst, err := d.Alloc(8<<20, 0)
		require.NoError(t, err)
		defer dst.Free()
		exts := blockScatter(rng, dst, 0, imp, 0, 1000, 8192)
		checkBatch(t, dst, exts, map[gpu.Buffer][]byte{imp: pattern(8<<20, 1)})
		require.Equal(t, "freed", c.ask(t, "quit"))
	})
}

// planOf is exts' plan (planBatch: every extent of d's buffers).
func planOf(tb testing.TB, d *Device, exts []gpu.Extent) *batchPlan {
	var pl batchPlan
	_, ok, err := d.planBatch(exts, true, &pl)
	require.True(tb, ok)
	require.NoError(tb, err)
	return &pl
}

// launchAlone uploads exts' descriptors (all below the threshold) into
// device memory once and runs fn(launch) where launch is one launch of the kernel over them and a
// cuStreamSynchronize: the kernel's own time, without the Go side.
func launchAlone(tb testing.TB, d *Device, exts []gpu.Extent, fn func(launch func() error)) {
	k, ok := d.scatterKernel()
	require.True(tb, ok, "scatter kernel: %v", d.kerr)
	pl := planOf(tb, d, exts)
	n := len(pl.descs)
	require.Positive(tb, n)
	require.Empty(tb, pl.engine)
	require.Less(tb, n, batchDescMax)
	err := d.withStager(func(s *stager) error {
		copy(s.buf[0][:n*descSize], unsafe.Slice((*byte)(unsafe.Pointer(&pl.descs[0])), n*descSize))
		arr, err := descArray(d, s, n)
		if err != nil {
			return err
		}
		defer d.drv.memFree(arr)
		fn(func() error {
			if err := d.launchScatter(k, s, 0, uint64(arr), n); err != nil {
				return err
			}
			return d.sync(s)
		})
		return nil
	})
	require.NoError(tb, err)
}

// descArray uploads the n descriptors in s's staging buffer 0 into device
// memory of their own (the caller frees it): the kernel's time without
// the bus, which issueBatch's launches read them over.
func descArray(d *Device, s *stager, n int) (devptr, error) {
	arr, r := d.drv.memAlloc(uint64(n * descSize))
	if err := check(d.drv, "cuMemAlloc_v2", r); err != nil {
		return 0, err
	}
	if err := check(d.drv, "cuMemcpyHtoDAsync_v2", d.drv.memcpyHtoDAsync(arr, s.ptr[0], uint64(n*descSize), s.stream)); err != nil {
		d.drv.memFree(arr)
		return 0, err
	}
	if err := d.sync(s); err != nil {
		d.drv.memFree(arr)
		return 0, err
	}
	return arr, nil
}

// BenchmarkRealCopyBatch measures, in one run on one GPU:
//
//   - 1000 (and 10,000) scattered 8 KiB copies between two allocations as
//     one gpu.CopyBatch, as 1000 cuMemcpyDtoDAsync on one stream and one
//     cuStreamSynchronize, and as the kernel alone (descriptors uploaded
//     once; one launch and one synchronization per op);
//   - the threshold sweep: extents of 4 KiB to 64 MiB (up to 1024 of
//     them, at most 256 MiB in all per op) through CopyBatch all in the
//     kernel against all on the copy engine; batchEngineMin is the size
//     from which the copy engine is as fast.
//
// On an H200 (2026-12-02, driver 580.159.04): 1000 x 8 KiB took 44 µs as
// one CopyBatch (30 µs of it the Go side: BenchmarkCopyBatchGoSide), 13 µs
// as the kernel alone and 5.3 ms as 1000 cuMemcpyDtoDAsync; 10,000 took
// 0.30 ms, 55 µs and 46.5 ms. With the one-pass plan (an H100 host,
// 2026-12-06): 25.6 µs against the kernel's 12.0 (the pass 9.4 µs; staging
// copy, upload, launch and synchronize 16.6), 10,000 in 232 µs against 67.
// With the descriptors read from the staging buffer, no upload (another
// H100 host, 2026-12-07): the issue 15.7 µs, CopyBatch 29.1 in all.
// Run a benchmark for a second or more: the first CopyBatch loads the
// kernel's module (the PTX's JIT compile), which 3000 calls showed as 33 µs
// more each. The sweep's figures are in batch.go's batchEngineMin comment.
func BenchmarkRealCopyBatch(b *testing.B) {
	d := openReal(b)[0]
	rng := rand.New(rand.NewPCG(5, 6))
	const span = 256 << 20
	src, err := d.Alloc(span, 0)
	require.NoError(b, err)
	defer src.Free()
	dst, err := d.Alloc(span, 0)
	require.NoError(b, err)
	defer dst.Free()
	_, err = src.WriteAt(pattern(64<<20, 1), 0)
	require.NoError(b, err)

	run := func(b *testing.B, exts []gpu.Extent) {
		for b.Loop() {
			if err := gpu.CopyBatch(exts); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, count := range []int{1000, 10000} {
		exts := blockScatter(rng, dst, 0, src, 0, count, 8192)
		name := fmt.Sprintf("%dx8K", count)
		b.Run(name+"/CopyBatch", func(b *testing.B) {
			b.SetBytes(int64(count) * 8192)
			run(b, exts)
		})
		b.Run(name+"/kernel-alone", func(b *testing.B) {
			b.SetBytes(int64(count) * 8192)
			launchAlone(b, d, exts, func(launch func() error) {
				for b.Loop() {
					if err := launch(); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
		// The parts of CopyBatch beyond the kernel: its pass over the
		// extents, its issue (the kernel reading the descriptors from
		// the page-locked staging buffer, which unified addressing maps
		// into every context), and what an upload of them into device
		// memory would cost instead.
		b.Run(name+"/plan", func(b *testing.B) {
			_, kernel := d.scatterKernel()
			require.True(b, kernel)
			var pl batchPlan
			for b.Loop() {
				pl.descs, pl.engine, pl.set = pl.descs[:0], pl.engine[:0], bufSet{}
				if _, ok, err := d.planBatch(exts, true, &pl); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
		})
		b.Run(name+"/issue", func(b *testing.B) {
			fn, _ := d.scatterKernel()
			pl := planOf(b, d, exts)
			require.NoError(b, d.withStager(func(s *stager) error {
				for b.Loop() {
					if err := d.issueBatch(s, pl, fn); err != nil {
						return err
					}
					if err := d.sync(s); err != nil {
						return err
					}
				}
				return nil
			}))
		})
		b.Run(name+"/upload-alone", func(b *testing.B) {
			require.NoError(b, d.withStager(func(s *stager) error {
				arr, r := d.drv.memAlloc(uint64(count * descSize))
				if err := check(d.drv, "cuMemAlloc_v2", r); err != nil {
					return err
				}
				defer d.drv.memFree(arr)
				for b.Loop() {
					if r := d.drv.memcpyHtoDAsync(arr, s.ptr[0], uint64(count*descSize), s.stream); r != success {
						return check(d.drv, "cuMemcpyHtoDAsync_v2", r)
					}
					if err := d.sync(s); err != nil {
						return err
					}
				}
				return nil
			}))
		})
		b.Run(name+"/kernel-host-descs", func(b *testing.B) {
			if count > batchDescMax {
				b.Skip("one staging buffer's worth only")
			}
			fn, _ := d.scatterKernel()
			pl := planOf(b, d, exts)
			require.NoError(b, d.withStager(func(s *stager) error {
				n := len(pl.descs)
				copy(s.buf[0][:n*descSize], unsafe.Slice((*byte)(unsafe.Pointer(&pl.descs[0])), n*descSize))
				for b.Loop() {
					if err := d.launchScatter(fn, s, 0, uint64(uintptr(s.ptr[0])), n); err != nil {
						return err
					}
					if err := d.sync(s); err != nil {
						return err
					}
				}
				return nil
			}))
		})
		b.Run(name+"/DtoD-calls", func(b *testing.B) {
			b.SetBytes(int64(count) * 8192)
			err := d.withStager(func(s *stager) error {
				for b.Loop() {
					for _, e := range exts {
						if r := d.drv.memcpyDtoDAsync(e.Dst.(*buffer).ptr(e.DstOff), e.Src.(*buffer).ptr(e.SrcOff), uint64(e.N), s.stream); r != success {
							return check(d.drv, "cuMemcpyDtoDAsync_v2", r)
						}
					}
					if err := d.sync(s); err != nil {
						return err
					}
				}
				return nil
			})
			require.NoError(b, err)
		})
	}

	old := batchEngineMin
	defer func() { batchEngineMin = old }()
	for _, size := range []int64{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20, 64 << 20} {
		count := int(min(1024, span/size))
		exts := blockScatter(rng, dst, 0, src, 0, count, size)
		for _, mode := range []string{"kernel", "engine"} {
			b.Run(fmt.Sprintf("sweep/%dK/%s", size>>10, mode), func(b *testing.B) {
				batchEngineMin = 1 << 62
				if mode == "engine" {
					batchEngineMin = 0
				}
				b.SetBytes(int64(count) * size)
				run(b, exts)
			})
		}
	}
}
