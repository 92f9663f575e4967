package gpu

import (
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"sync"
)

// Extent is one descriptor of a batched copy: N bytes from Src at byte SrcOff to Dst at byte DstOff.
// The ranges [SrcOff, SrcOff+N) and [DstOff, DstOff+N) must lie inside Src and Dst; N == 0 copies
// nothing. Several extents of one batch may name the same buffers (a KV-cache block list is
// usually many extents between two buffers, or within one).
type Extent struct {
	Dst    Buffer
	DstOff int64
	Src    Buffer
	SrcOff int64
	N      int64
}

// CopyBatch copies every extent, as one transfer where the backend allows it
// (CUDA: one gather/scatter kernel launch over a descriptor array for the small
// extents, the copy engine for large ones, one stream synchronization at the end);
// otherwise extent by extent with Copy. Ranges are checked first: any extent
// outside its buffers is ErrInvalidSize and nothing is copied.
// Overlapping extents race byte by byte (like RDMA writes).
//
// The batch goes first to the BatchCopier of the first extent's Dst, if it
// is one, which checks it and takes it or declines; when it declines
// (done=false), or there is none (host memory: memmove needs no batching),
// each extent is one Copy, in order, without allocating anything per extent;
// when every buffer is mapped host memory, as memmoves holding each buffer
// once, by several goroutines when the batch is large (copyHost). An error
// other than a range stops the batch there: the extents before it may have
// been copied, the rest are not.
// Errors: ErrInvalidSize (wrapped, naming the extent's index) for a negative offset
// or length or a range outside either buffer, ErrFreed, or what the backend or Copy
// reports.
func CopyBatch(exts []Extent) error {
	if len(exts) == 0 {
		return nil
	}
	// The BatchCopier's own pass checks every range: a check here first
	// was a second pass over a thousand extents, with an interface call
	// per buffer change.
	if bc, ok := exts[0].Dst.(BatchCopier); ok {
		if done, err := bc.CopyBatch(exts); done {
			return err
		}
	}
	// One pass checks every range (sizes are asked only when a buffer
	// changes: a batch usually writes one or a few buffers, and reads one
	// or a few).
	var srcB, dstB Buffer
	var srcN, dstN int64
	for i := range exts {
		e := &exts[i]
		if e.Dst == nil || e.Src == nil {
			return fmt.Errorf("copy batch: extent %d has no buffer: %w", i, ErrInvalidSize)
		}
		if e.Src != srcB {
			srcB, srcN = e.Src, e.Src.Size()
		}
		if e.Dst != dstB {
			dstB, dstN = e.Dst, e.Dst.Size()
		}
		if !inRange(srcN, e.SrcOff, e.N) || !inRange(dstN, e.DstOff, e.N) {
			return fmt.Errorf("copy batch: extent %d: %d bytes from %d/%d to %d/%d: %w",
				i, e.N, e.SrcOff, srcN, e.DstOff, dstN, ErrInvalidSize)
		}
	}
	if done, err := copyHost(exts); done {
		return err
	}
	for i := range exts {
		e := &exts[i]
		if e.N == 0 {
			continue
		}
		if err := Copy(e.Dst, e.DstOff, e.Src, e.SrcOff, e.N); err != nil {
			return fmt.Errorf("copy batch: extent %d: %w", i, err)
		}
	}
	return nil
}

// hostMemory is a buffer of host memory mapped into this process, which a
// batch holds against Free once for all its extents (a lock per extent,
// shared by several copying goroutines, cost more than the memmove of an
// 8 KiB extent: the lock's cache line moves between the cores).
type hostMemory interface {
	// rlockMem read-locks the buffer against Free and returns its bytes
	// (the buffer's own, from its offset). Errors, with nothing locked:
	// errNotMapped when the bytes are not mapped (an import read by
	// pread), ErrFreed, errReadOnly for a destination (write) opened
	// read-only.
	rlockMem(write bool) ([]byte, error)
	runlockMem()
}

// errNotMapped: a hostMemory whose bytes are not in this process's memory.
var errNotMapped = errors.New("not mapped")

// Host batches of at least parallelMin bytes are copied by up to
// maxWorkers goroutines, each taking at least parallelMin: one core's
// memmove reaches about half of what the memory gives two (measured
// here, 1000 scattered 8 KiB copies between memfd mappings: 624 µs on one
// goroutine, 337 µs on two), and a descriptor list's copy is the whole of
// its latency.
const (
	parallelMin = 1 << 20
	maxWorkers  = 8
)

// copyHost runs a batch whose buffers are all hostMemory: each buffer is
// locked once (in address order, so that two batches and a Free waiting
// between them cannot deadlock), then the extents are memmoves, shared by
// up to maxWorkers goroutines. done=false, nothing copied, when a buffer
// is not mapped host memory. A batch of a few buffers allocates nothing
// unless it is shared.
func copyHost(exts []Extent) (done bool, err error) {
	var bufsA [4]hostMemory
	var writesA [4]bool
	bufs, writes := bufsA[:0], writesA[:0]
	var lastSrc, lastDst Buffer
	var total int64
	var ok bool
	for i := range exts {
		e := &exts[i]
		if e.Src != lastSrc {
			if bufs, writes, ok = addHost(bufs, writes, e.Src, false); !ok {
				return false, nil
			}
			lastSrc = e.Src
		}
		if e.Dst != lastDst {
			if bufs, writes, ok = addHost(bufs, writes, e.Dst, true); !ok {
				return false, nil
			}
			lastDst = e.Dst
		}
		total += e.N
	}
	sortHost(bufs, writes)
	var memsA [4][]byte
	mems := memsA[:0]
	defer func() {
		for _, b := range bufs[:len(mems)] {
			b.runlockMem()
		}
	}()
	for i, b := range bufs {
		mem, err := b.rlockMem(writes[i])
		if errors.Is(err, errNotMapped) {
			return false, nil
		}
		if err != nil {
			return true, fmt.Errorf("copy batch: %w", err)
		}
		mems = append(mems, mem)
	}
	w := int(min(total/parallelMin, int64(runtime.GOMAXPROCS(0)), maxWorkers))
	if w <= 1 {
		moveExtents(bufs, mems, exts)
		return true, nil
	}
	// Every share on a goroutine of its own, none on this one: the new
	// goroutine would wait on this P's run queue until another P stole it
	// (measured: 420 µs for the 8 KiB × 1000 batch this way, 340 µs). The
	// goroutines get copies of the slices, so that the arrays stay on
	// the stack.
	sb, sm := slices.Clone(bufs), slices.Clone(mems)
	var wg sync.WaitGroup
	for _, p := range splitExtents(exts, total, w) {
		wg.Go(func() { moveExtents(sb, sm, p) })
	}
	wg.Wait()
	return true, nil
}

// addHost adds b (written, or read) to a host batch's distinct buffers;
// false when it is not hostMemory.
func addHost(bufs []hostMemory, writes []bool, b Buffer, write bool) ([]hostMemory, []bool, bool) {
	hm, ok := b.(hostMemory)
	if !ok {
		return bufs, writes, false
	}
	if i := slices.Index(bufs, hm); i >= 0 {
		writes[i] = writes[i] || write
		return bufs, writes, true
	}
	return append(bufs, hm), append(writes, write), true
}

// sortHost sorts a batch's few buffers into address order (the locking
// order), their write flags with them.
func sortHost(bufs []hostMemory, writes []bool) {
	addr := func(b hostMemory) uintptr { return reflect.ValueOf(b).Pointer() }
	for i := 1; i < len(bufs); i++ {
		for j := i; j > 0 && addr(bufs[j-1]) > addr(bufs[j]); j-- {
			bufs[j-1], bufs[j] = bufs[j], bufs[j-1]
			writes[j-1], writes[j] = writes[j], writes[j-1]
		}
	}
}

// moveExtents memmoves each extent between the bytes mems holds for its
// buffers in bufs, looking them up only when they change.
func moveExtents(bufs []hostMemory, mems [][]byte, exts []Extent) {
	var srcB, dstB Buffer
	var src, dst []byte
	for i := range exts {
		e := &exts[i]
		if e.Src != srcB {
			srcB, src = e.Src, mems[slices.Index(bufs, e.Src.(hostMemory))]
		}
		if e.Dst != dstB {
			dstB, dst = e.Dst, mems[slices.Index(bufs, e.Dst.(hostMemory))]
		}
		move(dst[e.DstOff:e.DstOff+e.N], src[e.SrcOff:e.SrcOff+e.N])
	}
}

// splitExtents cuts exts (total bytes) into w runs of about the same
// bytes: at extent boundaries, as sub-slices of exts, when no extent is
// larger than an eighth of a share (a descriptor list of blocks); else
// into new extents, cutting the large ones into pieces.
func splitExtents(exts []Extent, total int64, w int) [][]Extent {
	share := (total + int64(w) - 1) / int64(w)
	parts := make([][]Extent, 0, w+1)
	if !slices.ContainsFunc(exts, func(e Extent) bool { return e.N > share/8 }) {
		start, n := 0, int64(0)
		for i := range exts {
			if n += exts[i].N; n >= share {
				parts, start, n = append(parts, exts[start:i+1]), i+1, 0
			}
		}
		if start < len(exts) || len(parts) == 0 {
			parts = append(parts, exts[start:])
		}
		return parts
	}
	var cur []Extent
	var curN int64
	for _, e := range exts {
		for e.N > 0 {
			k := min(e.N, share-curN)
			cur = append(cur, Extent{Dst: e.Dst, DstOff: e.DstOff, Src: e.Src, SrcOff: e.SrcOff, N: k})
			e.DstOff, e.SrcOff, e.N, curN = e.DstOff+k, e.SrcOff+k, e.N-k, curN+k
			if curN == share {
				parts, cur, curN = append(parts, cur), nil, 0
			}
		}
	}
	if len(cur) > 0 || len(parts) == 0 {
		parts = append(parts, cur)
	}
	return parts
}

// inRange is checkRange's test alone (inlined: a batch checks thousands).
func inRange(size, off, n int64) bool {
	return off >= 0 && n >= 0 && off <= size && n <= size-off
}

// BatchCopier is implemented by buffers whose device can run a whole batch
// itself: CopyBatch offers it every batch whose first extent's Dst it is.
// done=false: not this batch (a Dst on another device, a source it cannot
// read), and nothing was copied; CopyBatch then uses the generic path.
// done=true: it checked every range first and copied nothing when one is
// outside its buffers (ErrInvalidSize), or it returns once every byte has
// landed (or the copy failed), like Copy.
type BatchCopier interface {
	CopyBatch(exts []Extent) (done bool, err error)
}

// RangeList is one share of CopyRanges: N ranges from Src into Dst, the
// k-th (At(k)) n bytes from byte srcOff of Src to byte dstOff of Dst. Each
// range must lie inside both buffers, and its destination bytes also
// before DstLen (a tensor's size, when Dst is its allocation's larger
// buffer).
type RangeList struct {
	Dst    Buffer
	DstLen int64
	Src    Buffer
	N      int
	At     func(k int) (srcOff, dstOff, n int64)
}

// RangeCopier is implemented by buffers whose device runs range lists
// itself, as BatchCopier runs extents: CopyRanges offers it every call
// whose first list's Dst it is. done=false: not these lists, and nothing
// was copied; done=true: as BatchCopier's (every range checked first).
type RangeCopier interface {
	CopyRanges(lists []RangeList) (done bool, err error)
}

// CopyRanges is CopyBatch for range lists, the form of a KV-cache call
// (a thousand blocks between one pair of tensors): a RangeCopier takes the
// lists as they are (on CUDA one pass from At to the kernel's descriptors:
// an Extent per range, with its two interface values, and a second pass
// over them cost 15-20 µs of a 1000-block copy on an H100 host, more than
// the kernel); otherwise the ranges become extents for CopyBatch. Every
// range is checked first: one outside its buffers or past DstLen is
// ErrInvalidSize (wrapped, naming the list and range) and nothing is
// copied. Errors: as CopyBatch's.
func CopyRanges(lists []RangeList) error {
	if len(lists) == 0 {
		return nil
	}
	if rc, ok := lists[0].Dst.(RangeCopier); ok {
		if done, err := rc.CopyRanges(lists); done {
			return err
		}
	}
	n := 0
	for _, l := range lists {
		n += l.N
	}
	ep := extentPool.Get().(*[]Extent)
	g := slices.Grow((*ep)[:0], n)
	defer func() {
		clear(g) // the buffers' references, which the pool would keep alive
		if cap(g) <= maxPooledExtents {
			*ep = g[:0]
			extentPool.Put(ep)
		}
	}()
	for i, l := range lists {
		for k := range l.N {
			srcOff, dstOff, n := l.At(k)
			if !inRange(l.DstLen, dstOff, n) {
				return fmt.Errorf("copy ranges: list %d, range %d: %d bytes to %d of %d: %w", i, k, n, dstOff, l.DstLen, ErrInvalidSize)
			}
			if n > 0 {
				g = append(g, Extent{Dst: l.Dst, DstOff: dstOff, Src: l.Src, SrcOff: srcOff, N: n})
			}
		}
	}
	return CopyBatch(g)
}

// extentPool keeps CopyRanges' extent arrays between calls: 1000 extents
// are 56 KB, which each call allocated and cleared (and collected) before.
// maxPooledExtents bounds what it keeps, in extents.
var extentPool = sync.Pool{New: func() any { return new([]Extent) }}

const maxPooledExtents = 1 << 16
