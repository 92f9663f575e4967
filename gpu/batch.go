package gpu

import "fmt"

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
// The batch goes to the BatchCopier of the first extent's Dst when every extent's
// Dst is on that buffer's device; when it declines (done=false), or there is none
// (host memory: memmove needs no batching), each extent is one Copy, in order,
// without allocating anything per extent. An error other than a range stops the
// batch there: the extents before it may have been copied, the rest are not.
// Errors: ErrInvalidSize (wrapped, naming the extent's index) for a negative offset
// or length or a range outside either buffer, ErrFreed, or what the backend or Copy
// reports.
func CopyBatch(exts []Extent) error {
	if len(exts) == 0 {
		return nil
	}
	// One pass checks every range and whether every Dst is on the first
	// one's device (asked only when Dst changes: a batch usually writes
	// one or a few buffers).
	dev, same, last := Device(nil), true, Buffer(nil)
	for i := range exts {
		e := &exts[i]
		if e.Dst == nil || e.Src == nil {
			return fmt.Errorf("copy batch: extent %d has no buffer: %w", i, ErrInvalidSize)
		}
		if !inRange(e.Src.Size(), e.SrcOff, e.N) || !inRange(e.Dst.Size(), e.DstOff, e.N) {
			return fmt.Errorf("copy batch: extent %d: %d bytes from %d/%d to %d/%d: %w",
				i, e.N, e.SrcOff, e.Src.Size(), e.DstOff, e.Dst.Size(), ErrInvalidSize)
		}
		if same && e.Dst != last {
			if last == nil {
				dev = e.Dst.Device()
			} else {
				same = e.Dst.Device() == dev
			}
			last = e.Dst
		}
	}
	if bc, ok := exts[0].Dst.(BatchCopier); ok && same {
		if done, err := bc.CopyBatch(exts); done {
			return err
		}
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

// inRange is checkRange's test alone (inlined: a batch checks thousands).
func inRange(size, off, n int64) bool {
	return off >= 0 && n >= 0 && off <= size && n <= size-off
}

// BatchCopier is implemented by buffers whose device can run a whole batch itself;
// CopyBatch offers it the batch when every extent's Dst is on that device.
// done=false: not this batch (e.g. a source it cannot read), use the generic path.
//
// CopyBatch calls it with every range already checked, but an implementation
// checks them again (it may be called directly) and copies nothing when one is
// outside its buffers (done=true, ErrInvalidSize). done=false must mean that
// nothing was copied. With done=true it returns once every byte has landed (or
// the copy failed), like Copy.
type BatchCopier interface {
	CopyBatch(exts []Extent) (done bool, err error)
}
