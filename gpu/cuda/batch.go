package cuda

// Batched copies (gpu.CopyBatch): one gather/scatter kernel launch over a
// descriptor array for the small extents, the copy engine for large ones,
// one stream synchronization at the end.

import (
	"cmp"
	_ "embed"
	"encoding/binary"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"unsafe"

	"github.com/tensorfs/tensorfs/gpu"
)

// scatterPTX is the kernel's module image: PTX made by nvcc from scatter.cu
// (gen-ptx.sh gives the command), JIT-compiled by the driver at the first
// batch of each device. A variable so that a test can load another build of it.
//
//go:embed scatter.ptx
var scatterPTX []byte

// scatterName is the kernel's symbol in the module (extern "C" in scatter.cu).
const scatterName = "tensorfs_scatter"

const (
	// descSize is the bytes of one descriptor as the kernel reads it:
	// struct tensorfs_desc { u64 dst, src, n; } (scatter.cu), which
	// scatterDesc is (the build fails if their sizes differ).
	descSize = 24
	// batchBlock is the threads of each block (scatter.cu's
	// __launch_bounds__): eight warps share one descriptor at a time.
	batchBlock = 256
	// batchPiece is the most bytes one descriptor carries: longer extents
	// are split, so that a launch's blocks get similar work and a 1 MiB
	// extent is copied by 16 blocks, not one.
	batchPiece = 64 << 10
	// paramsOff is where, in a staging buffer, the kernel's arguments and
	// the void*[] pointing at them are written for cuLaunchKernel (its
	// last 64 bytes); descriptors fill the bytes before it.
	paramsOff = stageSize - 64
)

// batchDescMax is the descriptors of one launch: as many as fit a staging
// buffer before paramsOff (43,688 of 24 bytes). A batch with more takes
// several launches, alternating between the stager's two buffers. A
// variable so that the tests can make launches small.
var batchDescMax = paramsOff / descSize

// batchEngineMin is the extent size in bytes from which an extent of a
// batch goes to the copy engine (cuMemcpyDtoDAsync, or cuMemcpyPeerAsync
// from another GPU) instead of the kernel: 16 MiB, chosen by measurement
// (BenchmarkRealCopyBatch/sweep, one H200, driver 580.159.04, 2026-12-02;
// GB/s of one CopyBatch of up to 1024 extents of that size, 256 MiB at
// most, all in the kernel / all on the copy engine):
//
//	4 KiB     102 / 0.75    2 MiB   1489 / 432
//	16 KiB    295 / 2.8     4 MiB   1361 / 877
//	64 KiB    927 / 14      8 MiB   1359 / 1189
//	256 KiB  1241 / 46     16 MiB   1485 / 1469
//	1 MiB    1465 / 186    32 MiB   1391 / 1640
//	                       64 MiB   1527 / 1805
//
// The copy engine costs 4-6 µs a call, so below a few MiB the kernel wins
// by far; at 16 MiB they are even, above it the engine is faster, and it
// leaves the SMs to the workload. A variable so that tests and the
// benchmark can move it.
var batchEngineMin int64 = 16 << 20

// CopyBatch implements gpu.BatchCopier: done when every extent's Dst is a
// buffer of b's device and every Src a CUDA buffer this device's context
// can address: one of this device (its own, an alias of one, or an IPC
// import mapped in this context, wherever its memory lives), or a buffer of
// another GPU of this process with peer access enabled from this one.
// Otherwise done is false and nothing is copied (an import mapped into
// another device's context, host memory, another driver instance, or a GPU
// without peer access: gpu.CopyBatch then copies extent by extent).
//
// Extents of at least batchEngineMin bytes are each one copy-engine call;
// the others are split into descriptors of at most batchPiece bytes,
// written into a page-locked staging buffer that the scatter kernel reads
// them from (issueBatch), and copied by one launch of it (one launch per
// batchDescMax descriptors), all on one stream and synchronized once. If
// the kernel cannot be loaded (a driver older than the PTX, say) every
// extent goes to the copy engine, still on one stream.
//
// One pass over the extents checks them and writes the device's work
// (batchPlan); the launch copies its descriptors into the staging buffer
// whole. Four passes, each with interface calls per extent, cost 30 µs of
// a 1000-extent batch on an H200 host, twice the kernel (2026-12-02); one
// CopyBatch of 1000 x 8 KiB is now 25.6 µs in all, the kernel alone 12.0
// (an H100 host, 2026-12-06: BenchmarkRealCopyBatch).
//
// Every buffer is held against Free for the copy. Errors: gpu.ErrInvalidSize
// (nothing copied) for a range outside its buffers, gpu.ErrFreed, the
// driver's *Error (cuLaunchKernel, or cuStreamSynchronize for a fault while
// the kernel ran; some extents may then have been copied).
func (b *buffer) CopyBatch(exts []gpu.Extent) (done bool, err error) {
	return b.dev.batch(func(pl *batchPlan, kernel bool) ([]*Device, bool, error) {
		return b.dev.planBatch(exts, kernel, pl)
	})
}

// batch runs the batch plan writes (planBatch, planRanges): plan checks
// it and adds its work and buffers to pl, with the kernel or without;
// done=false when plan declines or a source's GPU cannot be read from here
// (nothing copied). The buffers are held for the copy.
func (d *Device) batch(plan func(pl *batchPlan, kernel bool) (peers []*Device, ok bool, err error)) (done bool, err error) {
	fn, kernel := d.scatterKernel()
	pl := planPool.Get().(*batchPlan)
	defer pl.put()
	set := &pl.set
	peers, ok, err := plan(pl, kernel)
	if !ok || err != nil {
		return ok, err
	}
	for _, p := range peers {
		if !d.peerReadable(p) {
			return false, nil
		}
	}
	if err := set.rlock(); err != nil {
		return true, err
	}
	defer set.runlock()
	return true, d.runBatch(pl, fn)
}

// CopyRanges implements gpu.RangeCopier: CopyBatch for range lists, done
// on the same terms (every Dst a buffer of b's device, every Src one its
// context can address). Its pass (planRanges) writes each range's work
// straight from At, with the buffers' checks once per list.
func (b *buffer) CopyRanges(lists []gpu.RangeList) (done bool, err error) {
	return b.dev.batch(func(pl *batchPlan, kernel bool) ([]*Device, bool, error) {
		return b.dev.planRanges(lists, kernel, pl)
	})
}

// planRanges is planBatch for range lists: the buffers of each list are
// checked once, then each range (inside both buffers and before DstLen).
func (d *Device) planRanges(lists []gpu.RangeList, kernel bool, pl *batchPlan) (peers []*Device, ok bool, err error) {
	for i := range lists {
		l := &lists[i]
		dst, ok := l.Dst.(*buffer)
		src, ok2 := l.Src.(*buffer)
		if !ok || !ok2 || !d.pair(pl, &peers, dst, src) {
			return nil, false, nil
		}
		dstLen := min(dst.size, l.DstLen)
		for k := range l.N {
			srcOff, dstOff, n := l.At(k)
			if !inRange(dstLen, dstOff, n) || !inRange(src.size, srcOff, n) {
				return nil, true, fmt.Errorf("%s: copy ranges: list %d, range %d: %d bytes from %d/%d to %d/%d: %w",
					d.name, i, k, n, srcOff, src.size, dstOff, dstLen, gpu.ErrInvalidSize)
			}
			pl.add(dst.ptr(dstOff), src.dev, src.ptr(srcOff), n, kernel)
		}
	}
	return peers, true, nil
}

// pair checks a batch's copy from src into dst: dst of this device, src
// addressable from its context (this device's, or another GPU's own
// buffer, whose device joins peers); both join pl's buffer set. false:
// not this device's batch.
func (d *Device) pair(pl *batchPlan, peers *[]*Device, dst, src *buffer) bool {
	if dst.dev != d || src.dev.drv != d.drv {
		return false
	}
	if src.dev != d {
		if src.a.imp != nil {
			return false // mapped in src.dev's context, not this one's
		}
		if !slices.Contains(*peers, src.dev) {
			*peers = append(*peers, src.dev)
		}
	}
	pl.set.add(dst)
	pl.set.add(src)
	return true
}

// planBatch is CopyBatch's pass over the extents: it checks each one and
// adds its work and every buffer to pl; peers are the other GPUs
// that sources live on. ok is false (nothing planned worth keeping) when
// an extent is not this device's to copy; err is gpu.ErrInvalidSize for a
// range outside its buffers.
func (d *Device) planBatch(exts []gpu.Extent, kernel bool, pl *batchPlan) (peers []*Device, ok bool, err error) {
	var lastDst, lastSrc *buffer
	for i := range exts {
		e := &exts[i]
		// A type assertion is a comparison of the itab word, inlined; a
		// comparison of the interfaces would call runtime.ifaceeq on each
		// extent (a quarter of this loop's time).
		dst, ok := e.Dst.(*buffer)
		src, ok2 := e.Src.(*buffer)
		if !ok || !ok2 {
			return nil, false, nil
		}
		if dst != lastDst || src != lastSrc { // most extents repeat the pair before
			if !d.pair(pl, &peers, dst, src) {
				return nil, false, nil
			}
			lastDst, lastSrc = dst, src
		}
		if !inRange(dst.size, e.DstOff, e.N) || !inRange(src.size, e.SrcOff, e.N) {
			return nil, true, fmt.Errorf("%s: copy batch: extent %d: %d bytes from %d/%d to %d/%d: %w",
				d.name, i, e.N, e.SrcOff, src.size, e.DstOff, dst.size, gpu.ErrInvalidSize)
		}
		pl.add(dst.ptr(e.DstOff), src.dev, src.ptr(e.SrcOff), e.N, kernel)
	}
	return peers, true, nil
}

// scatterDesc is one descriptor as the kernel reads it: struct
// tensorfs_desc { u64 dst, src, n; } of scatter.cu, 24 bytes, in host byte
// order, which is the GPU's (CUDA hosts are little-endian: x86-64,
// aarch64, ppc64le), so that a plan's descriptors go to the staging buffer
// as one copy.
type scatterDesc struct {
	dst, src devptr
	n        uint64
}

// The build fails unless scatterDesc is descSize bytes.
var _ [descSize]byte = [unsafe.Sizeof(scatterDesc{})]byte{}

// engineCopy is one copy-engine call of a batch: n bytes to dst from src,
// which lives on from (the batch's device, or a peer).
type engineCopy struct {
	dst, src devptr
	from     *Device
	n        int64
}

// batchPlan is a batch's work for the device, as CopyBatch's pass over
// its extents writes it: the kernel's descriptors and the copy-engine
// calls. Plans are pooled: a thousand descriptors are 24 KB.
type batchPlan struct {
	descs  []scatterDesc
	engine []engineCopy
	set    bufSet // every buffer of the batch, once
}

var planPool = sync.Pool{New: func() any { return new(batchPlan) }}

// maxPooledDescs bounds the descriptors a pooled plan keeps room for.
const maxPooledDescs = 1 << 16

// add plans n bytes to dst from src (on from): a copy-engine call for a
// large extent (or every extent, without the kernel), else descriptors of
// at most batchPiece bytes.
func (pl *batchPlan) add(dst devptr, from *Device, src devptr, n int64, kernel bool) {
	switch {
	case n == 0:
	case !kernel || n >= batchEngineMin:
		pl.engine = append(pl.engine, engineCopy{dst: dst, src: src, from: from, n: n})
	default:
		for off := int64(0); off < n; off += batchPiece {
			pl.descs = append(pl.descs, scatterDesc{dst + devptr(off), src + devptr(off), uint64(min(batchPiece, n-off))})
		}
	}
}

func (pl *batchPlan) put() {
	if cap(pl.descs) > maxPooledDescs || cap(pl.engine) > maxPooledDescs {
		return
	}
	pl.descs, pl.engine = pl.descs[:0], pl.engine[:0]
	clear(pl.engine[:cap(pl.engine)]) // the devices they name
	clear(pl.set.list[:cap(pl.set.list)])
	pl.set = bufSet{list: pl.set.list[:0]} // no buffer kept alive by the pool
	planPool.Put(pl)
}

// inRange is checkRange's test alone (inlined: a batch checks thousands).
func inRange(size, off, n int64) bool {
	return off >= 0 && n >= 0 && off <= size && n <= size-off
}

// bufSet is the distinct buffers of a batch. A batch names few buffers
// many times over (a block list between two tensors), so a lookup is a
// comparison with the last one added or a scan of a short list; past
// bufSetScan buffers a map takes over.
type bufSet struct {
	list []*buffer
	last *buffer
	m    map[*buffer]struct{}
}

// bufSetScan is the longest list bufSet.add searches by scanning.
const bufSetScan = 16

func (s *bufSet) add(x *buffer) {
	if x == s.last {
		return
	}
	s.last = x
	if s.m != nil {
		if _, ok := s.m[x]; !ok {
			s.m[x] = struct{}{}
			s.list = append(s.list, x)
		}
		return
	}
	if slices.Contains(s.list, x) {
		return
	}
	s.list = append(s.list, x)
	if len(s.list) > bufSetScan {
		s.m = make(map[*buffer]struct{}, 2*len(s.list))
		for _, y := range s.list {
			s.m[y] = struct{}{}
		}
	}
}

// rlock takes every buffer of the set for I/O in the order of their
// sequence numbers (as lockPair does, so that batches and copies with a
// Free waiting cannot deadlock); on an error (gpu.ErrFreed) none is held.
func (s *bufSet) rlock() error {
	slices.SortFunc(s.list, func(x, y *buffer) int { return cmp.Compare(x.seq, y.seq) })
	for i, x := range s.list {
		if err := x.rlock(); err != nil {
			for _, y := range s.list[:i] {
				y.mu.RUnlock()
			}
			return err
		}
	}
	return nil
}

func (s *bufSet) runlock() {
	for _, y := range s.list {
		y.mu.RUnlock()
	}
}

// runBatch issues a plan on one stager's stream and waits for it: the
// copy-engine calls, then the kernel over the descriptors (one launch per
// batchDescMax of them). The buffers are held and every range is checked;
// fn is the kernel when the plan has descriptors.
func (d *Device) runBatch(pl *batchPlan, fn cuFunc) error {
	return d.withStager(func(s *stager) error {
		err := d.issueBatch(s, pl, fn)
		if err != nil {
			d.sync(s) // nothing in flight may outlive the call
			return err
		}
		return d.sync(s)
	})
}

// issueBatch enqueues a plan's work on s. The descriptors go in pieces of
// batchDescMax through the stager's two staging buffers, alternately: a
// piece is copied into one and the kernel is launched over it there (the
// buffer is page-locked memory, which unified addressing maps into every
// context at the same address), and before a buffer is refilled the stream
// is synchronized, which waits for the kernel that last read it (the
// stream runs in order).
//
// Why no upload into device memory first: cuMemcpyHtoDAsync of 1000
// descriptors (24 KB) kept the CPU 9 µs (the driver copies a small upload
// into its command stream) where the kernel reads them over the bus for 2
// µs more than from device memory (H100 host, BenchmarkRealCopyBatch
// 1000x8K: upload alone 9.6 µs; launch and synchronize 12.6 µs with the
// descriptors in device memory, 14.7 µs in the staging buffer).
func (d *Device) issueBatch(s *stager, pl *batchPlan, fn cuFunc) error {
	for _, c := range pl.engine {
		if err := d.engineCopy(s, c); err != nil {
			return err
		}
	}
	var pending [2]bool // a kernel reading that staging buffer may not have run yet
	for k, h := 0, 0; k < len(pl.descs); k, h = k+batchDescMax, h^1 {
		if pending[h] {
			if err := d.sync(s); err != nil { // waits for every kernel before
				return err
			}
			pending = [2]bool{}
		}
		pending[h] = true
		piece := pl.descs[k:min(k+batchDescMax, len(pl.descs))]
		n := len(piece)
		copy(s.buf[h][:n*descSize], unsafe.Slice((*byte)(unsafe.Pointer(&piece[0])), n*descSize))
		if err := d.launchScatter(fn, s, h, uint64(uintptr(s.ptr[h])), n); err != nil {
			return err
		}
	}
	return nil
}

// engineCopy enqueues one copy-engine call of a plan on s.
func (d *Device) engineCopy(s *stager, c engineCopy) error {
	if c.from == d {
		return check(d.drv, "cuMemcpyDtoDAsync_v2", d.drv.memcpyDtoDAsync(c.dst, c.src, uint64(c.n), s.stream))
	}
	return check(d.drv, "cuMemcpyPeerAsync", d.drv.memcpyPeerAsync(c.dst, d.ctx, c.src, c.from.ctx, uint64(c.n), s.stream))
}

// launchScatter launches the scatter kernel fn on s's stream over the n
// descriptors at descs (an address the GPU reads), one block each. The
// kernel's arguments (descs, count) and the void*[] of pointers to them go
// into staging buffer h's last bytes, page-locked C memory:
// cuLaunchKernel reads them before it returns, and the kernel reads only
// the descriptors, before paramsOff.
func (d *Device) launchScatter(fn cuFunc, s *stager, h int, descs uint64, n int) error {
	args := s.buf[h][paramsOff : paramsOff+32]
	base := uintptr(s.ptr[h]) + paramsOff
	binary.LittleEndian.PutUint64(args[0:], descs)
	binary.LittleEndian.PutUint64(args[8:], uint64(n))
	binary.LittleEndian.PutUint64(args[16:], uint64(base))
	binary.LittleEndian.PutUint64(args[24:], uint64(base+8))
	grid := [3]uint32{uint32(n), 1, 1}
	block := [3]uint32{batchBlock, 1, 1}
	return check(d.drv, "cuLaunchKernel", d.drv.launchKernel(fn, grid, block, 0, s.stream, unsafe.Add(s.ptr[h], paramsOff+16)))
}

// scatterKernel returns the scatter kernel, loading its module into the
// device's primary context at the first call; ok is false when the load
// failed (logged once), and batches then use the copy engine only.
func (d *Device) scatterKernel() (fn cuFunc, ok bool) {
	d.kmu.Lock()
	defer d.kmu.Unlock()
	if !d.kloaded {
		d.kloaded = true
		d.kerr = d.withCtx(d.loadKernel)
		if d.kerr != nil {
			slog.Warn("scatter kernel not loaded, batched copies use the copy engine", "device", d.name, "err", d.kerr)
		}
	}
	return d.kfn, d.kerr == nil
}

// loadKernel is cuModuleLoadData of scatterPTX (NUL-terminated, as the
// driver reads PTX text) and cuModuleGetFunction; the context is current.
func (d *Device) loadKernel() error {
	image := append(slices.Clip(scatterPTX), 0)
	m, r := d.drv.moduleLoadData(image)
	if err := check(d.drv, "cuModuleLoadData", r); err != nil {
		return err
	}
	fn, r := d.drv.moduleGetFunction(m, scatterName)
	if err := check(d.drv, "cuModuleGetFunction", r); err != nil {
		d.drv.moduleUnload(m)
		return err
	}
	d.kmod, d.kfn = m, fn
	return nil
}

// unloadKernel unloads the scatter kernel's module, if it was loaded (Close).
func (d *Device) unloadKernel() error {
	d.kmu.Lock()
	defer d.kmu.Unlock()
	if d.kmod == 0 {
		return nil
	}
	m := d.kmod
	d.kmod, d.kfn = 0, 0
	err := d.withCtx(func() error { return check(d.drv, "cuModuleUnload", d.drv.moduleUnload(m)) })
	if err != nil {
		return fmt.Errorf("%s: unload the scatter kernel: %w", d.name, err)
	}
	return nil
}

var _ gpu.BatchCopier = (*buffer)(nil)
