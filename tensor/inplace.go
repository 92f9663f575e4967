package tensor

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"github.com/tensorfs/tensorfs/gpu"
)

// WriteInPlaceV runs fill on the tensor's pieces when they are host memory
// mapped into the daemon (gpu.InPlace), so that a copy receives from its
// socket straight into the tensor, with one readv, instead of through a
// buffer and WriteAt: fill gets each piece's bytes, in order, as the slices
// of iov (one piece for a range, one per span's piece for a range list),
// and returns how many of them it wrote (from the first: what the socket
// held).
// The pieces must lie within the tensor's size (no growth); the tensor's
// allocation cannot change or go away until fill returns. ok is false
// (fill not run) for device memory or an unallocated tensor: the caller
// writes with WriteAt then. Errors: ErrInvalid for a piece outside the
// size, ErrReleased, or fill's.
func (t *Tensor) WriteInPlaceV(pieces []Piece, fill func(iov [][]byte) (int64, error)) (ok bool, err error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.released {
		return true, ErrReleased
	}
	for _, pc := range pieces {
		if pc.Off < 0 || pc.N < 0 || pc.Off > t.size-pc.N {
			return true, fmt.Errorf("write [%d, +%d) in %d bytes: %w", pc.Off, pc.N, t.size, ErrInvalid)
		}
	}
	if t.alloc == nil {
		return false, nil
	}
	return gpu.InPlace(t.alloc.buf, 0, t.size, func(all []byte) error {
		var arr [64][]byte
		iov := arr[:0]
		for _, pc := range pieces {
			iov = append(iov, all[pc.Off:pc.Off+pc.N])
		}
		_, err := fill(iov)
		return err
	})
}

// PinRange pins the tensor for an in-place copy into its bytes [off,
// off+n) (DESIGN.md "In-place copies"): until unpin is called, its size and
// allocation cannot change (Truncate, Allocate, Adopt and a write past the
// size wait), so the copy's bytes land in the memory that its importers
// mapped, and its mr_id, ipc_id and generation stay. Writes within the
// size and reads go on (an in-place write races with them byte by byte,
// like an RDMA WRITE). The caller keeps a Handle open for the pin's
// duration, so that an unlink cannot free the memory either. unpin is
// idempotent. Errors: ErrInvalid for a range outside the size (an
// unallocated tensor has size 0), ErrReleased, mr's Pin errors.
func (t *Tensor) PinRange(off, n int64) (unpin func(), err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.released {
		return nil, ErrReleased
	}
	if off < 0 || n < 0 || off > t.size-n {
		return nil, fmt.Errorf("range [%d, +%d) of a %d-byte tensor: %w", off, n, t.size, ErrInvalid)
	}
	// The memory region is pinned too: stats count the pin, and the
	// region cannot be deregistered under the copy.
	mrUnpin := func() {}
	if t.alloc != nil {
		if mrUnpin, err = t.s.MRs.Pin(t.alloc.region.ID); err != nil {
			return nil, err
		}
	}
	if t.thawed == nil {
		t.thawed = sync.NewCond(&t.mu)
	}
	t.pinned++
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			if t.pinned--; t.pinned == 0 {
				t.thawed.Broadcast()
			}
			t.mu.Unlock()
			mrUnpin()
		})
	}, nil
}

// WriteRange writes p at off, which must lie within the size: the write of
// an in-place copy. Unlike WriteAt it never grows the tensor and does not
// wait for the copies reading it (Freeze): an in-place destination may be
// a source of the same call, frozen by it. Errors: ErrInvalid for a range
// outside the size, ErrReleased, the device's.
func (t *Tensor) WriteRange(p []byte, off int64) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.released {
		return ErrReleased
	}
	n := int64(len(p))
	if off < 0 || off > t.size-n {
		return fmt.Errorf("write [%d, +%d) in %d bytes: %w", off, n, t.size, ErrInvalid)
	}
	if n == 0 {
		return nil
	}
	_, err := t.alloc.buf.WriteAt(p, off)
	return err
}

// Extent is one descriptor of a batched copy into a tensor: N bytes of Src
// at byte SrcOff (or, with Src nil, of the buffer SrcBuf, e.g. another
// daemon's allocation imported by IPC) into Dst at byte DstOff.
type Extent struct {
	Dst    *Tensor
	DstOff int64
	Src    *Tensor
	SrcBuf gpu.Buffer
	SrcOff int64
	N      int64
}

// CopyExtents is the one device-to-device copy into tensors (local copies,
// and IPC copies out of another daemon's imported allocation): it copies
// every extent as one batch
// (gpu.CopyBatch: on CUDA one gather/scatter kernel launch for the small
// ones), without waiting for the copies reading the destinations (see
// WriteRange). Every range is checked first: one outside its tensor is
// ErrInvalid and nothing is copied. Errors: ErrInvalid, ErrReleased, the
// device's.
func CopyExtents(exts []Extent) error {
	// Read-lock each tensor once, in address order, so that two batches
	// in opposite directions cannot deadlock with a resize waiting
	// between them.
	// A KV-cache batch names a few tensors a thousand times: they are
	// gathered without duplicates first (sorting 2000 pointers was a
	// tenth of a 1000-extent call).
	var ts []*Tensor
	var seen map[*Tensor]bool // past a few tensors (a directory's batch)
	add := func(t *Tensor) {
		if t == nil || len(ts) > 0 && ts[len(ts)-1] == t {
			return
		}
		if seen == nil {
			if slices.Contains(ts, t) {
				return
			}
			if len(ts) == 16 {
				seen = make(map[*Tensor]bool, len(exts))
				for _, x := range ts {
					seen[x] = true
				}
			}
		}
		if seen != nil {
			if seen[t] {
				return
			}
			seen[t] = true
		}
		ts = append(ts, t)
	}
	for _, e := range exts {
		add(e.Dst)
		add(e.Src)
	}
	slices.SortFunc(ts, func(a, b *Tensor) int { return cmp.Compare(uintptr(unsafe.Pointer(a)), uintptr(unsafe.Pointer(b))) })
	for _, t := range ts {
		t.mu.RLock()
	}
	defer func() {
		for _, t := range ts {
			t.mu.RUnlock()
		}
	}()
	g := make([]gpu.Extent, 0, len(exts))
	for _, e := range exts {
		if e.Dst.released || e.Src != nil && e.Src.released {
			return ErrReleased
		}
		if e.N < 0 || e.DstOff < 0 || e.DstOff > e.Dst.size-e.N {
			return fmt.Errorf("copy %d bytes to [%d, +%d) of a %d-byte tensor: %w", e.N, e.DstOff, e.N, e.Dst.size, ErrInvalid)
		}
		src := e.SrcBuf
		if e.Src != nil {
			if e.SrcOff < 0 || e.SrcOff > e.Src.size-e.N {
				return fmt.Errorf("copy [%d, +%d) of a %d-byte tensor: %w", e.SrcOff, e.N, e.Src.size, ErrInvalid)
			}
			if e.N > 0 {
				src = e.Src.alloc.buf
			}
		}
		if e.N == 0 {
			continue
		}
		g = append(g, gpu.Extent{Dst: e.Dst.alloc.buf, DstOff: e.DstOff, Src: src, SrcOff: e.SrcOff, N: e.N})
	}
	if err := gpu.CopyBatch(g); err != nil {
		if errors.Is(err, gpu.ErrInvalidSize) {
			return fmt.Errorf("%v: %w", err, ErrInvalid)
		}
		return err
	}
	return nil
}

// Piece is N bytes at byte Off of a tensor, one piece of a Gather.
type Piece struct{ Off, N int64 }

// Gather reads the tensor's pieces into p, laid end to end (their N must add
// up to len(p)): the read of a range-list descriptor's bytes for a TCP copy.
// With scratch, device memory of at least len(p) bytes on the tensor's
// device (Scratch), the pieces are gathered there by one batch
// (gpu.CopyBatch: on CUDA one gather kernel launch) and read to the host by
// one copy, where a ReadAt each cost a device-to-host copy and a stream
// synchronize (10 µs an 8 KiB piece on an H200); without, piece by piece
// under one lock. Errors: ErrInvalid for a piece outside the size or pieces
// that do not fill p, ErrReleased, the device's.
func (t *Tensor) Gather(p []byte, pieces []Piece, scratch gpu.Buffer) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.released {
		return ErrReleased
	}
	var n int64
	for _, pc := range pieces {
		if pc.N < 0 || pc.Off < 0 || pc.Off > t.size-pc.N {
			return fmt.Errorf("read [%d, +%d) of a %d-byte tensor: %w", pc.Off, pc.N, t.size, ErrInvalid)
		}
		n += pc.N
	}
	if n != int64(len(p)) {
		return fmt.Errorf("pieces of %d bytes into %d: %w", n, len(p), ErrInvalid)
	}
	if n == 0 {
		return nil
	}
	if scratch != nil && scratch.Size() >= n {
		g := make([]gpu.Extent, 0, len(pieces))
		var pos int64
		for _, pc := range pieces {
			g = append(g, gpu.Extent{Dst: scratch, DstOff: pos, Src: t.alloc.buf, SrcOff: pc.Off, N: pc.N})
			pos += pc.N
		}
		if err := gpu.CopyBatch(g); err != nil {
			return err
		}
		_, err := scratch.ReadAt(p, 0)
		return err
	}
	var pos int64
	for _, pc := range pieces {
		if _, err := t.alloc.buf.ReadAt(p[pos:pos+pc.N], pc.Off); err != nil {
			return err
		}
		pos += pc.N
	}
	return nil
}

// SpanList is one destination's share of CopySpans: N ranges from Src (a
// buffer, e.g. another daemon's allocation imported by IPC) into Dst, the
// k-th n bytes at byte srcOff of Src into byte dstOff of Dst, as At(k)
// says.
type SpanList struct {
	Dst *Tensor
	Src gpu.Buffer
	N   int
	At  func(k int) (srcOff, dstOff, n int64)
}

// CopySpans is CopyExtents for range lists: the ranges of every list as one
// batch (gpu.CopyRanges: on CUDA one pass from the lists to the descriptors
// of one gather/scatter kernel launch). Every range is checked first: one
// outside its tensor is ErrInvalid and nothing is copied. Errors:
// ErrInvalid, ErrReleased, the device's.
func CopySpans(lists []SpanList) error {
	var ts []*Tensor
	for _, l := range lists {
		if !slices.Contains(ts, l.Dst) {
			ts = append(ts, l.Dst)
		}
	}
	// In address order, as CopyExtents (a destination list names few
	// tensors).
	slices.SortFunc(ts, func(a, b *Tensor) int { return cmp.Compare(uintptr(unsafe.Pointer(a)), uintptr(unsafe.Pointer(b))) })
	for _, t := range ts {
		t.mu.RLock()
	}
	defer func() {
		for _, t := range ts {
			t.mu.RUnlock()
		}
	}()
	rl := make([]gpu.RangeList, 0, len(lists))
	for _, l := range lists {
		t := l.Dst
		if t.released {
			return ErrReleased
		}
		var dst gpu.Buffer
		if t.alloc != nil {
			dst = t.alloc.buf
		}
		rl = append(rl, gpu.RangeList{Dst: dst, DstLen: t.size, Src: l.Src, N: l.N, At: l.At})
	}
	if err := gpu.CopyRanges(rl); err != nil {
		if errors.Is(err, gpu.ErrInvalidSize) {
			return fmt.Errorf("%v: %w", err, ErrInvalid)
		}
		return err
	}
	return nil
}

// HostMemory is the tensor's bytes when they are host memory mapped into
// the daemon, for a transport that reads and writes them outside the
// tensor's lock (UCX one-sided, the TCP sender without checksums): mem is
// the tensor's size in bytes from its byte 0, rkey its memory region's
// packed remote key (mr.Region.Rkey; nil when no transport maps it). The
// caller holds the allocation still for as long as it uses mem: a source
// frozen (Freeze) and open, an in-place destination pinned (PinRange), a
// copy's own temporary. ok is false for device memory, or no bytes.
func (t *Tensor) HostMemory() (mem []byte, rkey []byte, ok bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.released || t.alloc == nil || t.size == 0 {
		return nil, nil, false
	}
	isHost, _ := gpu.InPlace(t.alloc.buf, 0, t.size, func(p []byte) error {
		mem = p
		return nil
	})
	if !isHost || len(mem) == 0 {
		return nil, nil, false
	}
	return mem, t.alloc.region.Rkey, true
}
