package tensor

import (
	"fmt"

	"github.com/tensorfs/tensorfs/gpu"
)

// WriteInPlace runs fill on the tensor's bytes [off, off+n) when they are
// host memory mapped into the daemon (gpu.InPlace), so that a copy receives
// from its socket straight into the tensor instead of through a buffer and
// WriteAt. The range must lie within the tensor's size (no growth); the
// tensor's allocation cannot change or go away until fill returns. ok is
// false (fill not run) for device memory or an unallocated tensor: the
// caller writes with WriteAt then. Errors: ErrInvalid for a range outside
// the size, ErrReleased, or fill's.
func (t *Tensor) WriteInPlace(off, n int64, fill func(p []byte) error) (ok bool, err error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.released {
		return true, ErrReleased
	}
	if off < 0 || n < 0 || off > t.size-n {
		return true, fmt.Errorf("write [%d, +%d) in %d bytes: %w", off, n, t.size, ErrInvalid)
	}
	if t.alloc == nil {
		return false, nil
	}
	return gpu.InPlace(t.alloc.buf, off, n, fill)
}
