package gpu

import "fmt"

// Extent is one descriptor of a batched copy: N bytes from Src at byte
// SrcOff to Dst at byte DstOff.
type Extent struct {
	Dst    Buffer
	DstOff int64
	Src    Buffer
	SrcOff int64
	N      int64
}

// CopyBatch copies every extent, as one transfer where the backend allows
// it (BatchCopier), otherwise extent by extent with Copy. Ranges are
// checked first: any extent outside its buffers is ErrInvalidSize and
// nothing is copied. Overlapping extents race byte by byte (like RDMA
// writes).
func CopyBatch(exts []Extent) error {
	for _, e := range exts {
		if checkRange(e.Src.Size(), e.SrcOff, e.N) != nil || checkRange(e.Dst.Size(), e.DstOff, e.N) != nil {
			return fmt.Errorf("copy %d bytes from %d/%d to %d/%d: %w", e.N, e.SrcOff, e.Src.Size(), e.DstOff, e.Dst.Size(), ErrInvalidSize)
		}
	}
	if len(exts) == 0 {
		return nil
	}
	if bc, ok := exts[0].Dst.(BatchCopier); ok {
		if done, err := bc.CopyBatch(exts); done {
			return err
		}
	}
	for _, e := range exts {
		if err := Copy(e.Dst, e.DstOff, e.Src, e.SrcOff, e.N); err != nil {
			return err
		}
	}
	return nil
}

// BatchCopier is implemented by buffers whose device can run a whole batch
// itself; CopyBatch offers it the batch when every extent's Dst is on that
// device. done=false: not this batch, use the generic path.
type BatchCopier interface {
	CopyBatch(exts []Extent) (done bool, err error)
}
