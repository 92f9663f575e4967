package cuda

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/tensorfs/tensorfs/gpu"
)

// buffer is one tensor's device memory: a range of an arena, or a large
// allocation of its own. It implements gpu.Buffer.
type buffer struct {
	dev  *Device
	a    *allocation
	off  int64 // byte offset in a
	size int64 // exactly the bytes asked for
	span int64 // bytes taken from a (size rounded up)
	seq  uint64

	// mu guards freed: I/O holds it shared, so Free waits for I/O in flight
	// and no copy ever lands in a range that was handed to another tensor.
	mu    sync.RWMutex
	freed bool
}

var _ gpu.Buffer = (*buffer)(nil)

// bufferSeq orders buffers for locking two at once.
var bufferSeq atomic.Uint64

// ID implements gpu.Buffer: the id of the allocation (arena or own) the
// buffer lives in; for an imported buffer, an id of its own per Import.
func (b *buffer) ID() uint64 { return b.a.id }

// Offset implements gpu.Buffer: the ipc_offset, a multiple of Align (for
// an imported buffer, the offset given to Import).
func (b *buffer) Offset() int64 { return b.off }

// Device implements gpu.Buffer.
func (b *buffer) Device() gpu.Device { return b.dev }

// Size implements gpu.Buffer: exactly the nbytes given to Alloc.
func (b *buffer) Size() int64 { return b.size }

// Addr implements gpu.Buffer: the CUdeviceptr of the buffer's first byte.
func (b *buffer) Addr() uintptr { return uintptr(b.a.base) + uintptr(b.off) }

// Handle implements gpu.Buffer: "cuda:" + 128 lowercase hex digits of the
// CUipcMemHandle of the allocation the buffer lives in.
func (b *buffer) Handle() string { return b.a.handle }

func (b *buffer) ptr(off int64) devptr { return b.a.base + devptr(b.off+off) }

// rlock takes the buffer for I/O; the error is gpu.ErrFreed.
func (b *buffer) rlock() error {
	b.mu.RLock()
	if b.freed {
		b.mu.RUnlock()
		return fmt.Errorf("%s buffer %d+%d: %w", b.dev.name, b.a.id, b.off, gpu.ErrFreed)
	}
	return nil
}

// ReadAt implements gpu.Buffer, through page-locked staging buffers.
// Errors: gpu.ErrInvalidSize outside the buffer, gpu.ErrFreed, the driver's
// *Error.
func (b *buffer) ReadAt(p []byte, off int64) (int, error) {
	if err := checkRange(b.size, off, int64(len(p))); err != nil {
		return 0, err
	}
	if err := b.rlock(); err != nil {
		return 0, err
	}
	defer b.mu.RUnlock()
	if len(p) == 0 {
		return 0, nil
	}
	if err := b.dev.dtoh(p, b.ptr(off)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteAt implements gpu.Buffer, with the bounds and errors of ReadAt. The
// bytes are on the device when it returns.
func (b *buffer) WriteAt(p []byte, off int64) (int, error) {
	if err := checkRange(b.size, off, int64(len(p))); err != nil {
		return 0, err
	}
	if err := b.rlock(); err != nil {
		return 0, err
	}
	defer b.mu.RUnlock()
	if len(p) == 0 {
		return 0, nil
	}
	if err := b.dev.htod(b.ptr(off), p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Zero implements gpu.Buffer with cuMemsetD8, waiting for it to land.
func (b *buffer) Zero(off, n int64) error {
	if err := checkRange(b.size, off, n); err != nil {
		return err
	}
	if err := b.rlock(); err != nil {
		return err
	}
	defer b.mu.RUnlock()
	if n == 0 {
		return nil
	}
	return b.dev.zero(b.ptr(off), n)
}

// Free implements gpu.Buffer: the range goes back to its arena (the arena to
// the driver once it holds no buffer), or a large buffer's allocation to the
// driver. An imported buffer instead drops its IPC mapping
// (cuIpcCloseMemHandle once no buffer imported from it is left) or its pin
// on the local allocation it aliases, and never frees the owner's memory.
// A second Free returns gpu.ErrFreed.
func (b *buffer) Free() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed {
		return fmt.Errorf("%s buffer %d+%d: %w", b.dev.name, b.a.id, b.off, gpu.ErrFreed)
	}
	b.freed = true
	switch {
	case b.a.imp != nil:
		return b.dev.closeMapping(b.a.imp)
	case b.a.alias != nil:
		return unpin(b.a.alias)
	}
	return b.dev.release(b.a, b.off, b.span)
}

// CopyFrom copies n bytes from src at srcOff into b at dstOff without going
// through Go memory where it can: cuMemcpyDtoD from a buffer of the same GPU,
// cuMemcpyPeer from another GPU's (peer access enabled once per pair when the
// hardware allows it), and from any other buffer (host memory) by reading it
// straight into the page-locked staging buffers. done is false when src is a
// buffer of another driver instance, for the generic path. It is the direct
// path for gpu.Copy (see the report on gpu's hook). Errors:
// gpu.ErrInvalidSize for ranges outside either buffer, gpu.ErrFreed, the
// driver's *Error, src's errors.
func (b *buffer) CopyFrom(dstOff int64, src gpu.Buffer, srcOff, n int64) (done bool, err error) {
	if err := checkRange(b.size, dstOff, n); err != nil {
		return true, err
	}
	if err := checkRange(src.Size(), srcOff, n); err != nil {
		return true, err
	}
	s, isCUDA := src.(*buffer)
	if isCUDA && s.dev.drv != b.dev.drv {
		return false, nil
	}
	if n == 0 {
		return true, nil
	}
	if !isCUDA {
		if err := b.rlock(); err != nil {
			return true, err
		}
		defer b.mu.RUnlock()
		return true, b.dev.htodFrom(b.ptr(dstOff), src, srcOff, n)
	}
	unlock, err := lockPair(b, s)
	if err != nil {
		return true, err
	}
	defer unlock()
	if s.dev == b.dev {
		return true, b.dev.dtod(b.ptr(dstOff), s.ptr(srcOff), n)
	}
	return true, b.dev.peer(b.ptr(dstOff), s.dev, s.ptr(srcOff), n)
}

// CopyTo copies n bytes from b at srcOff into dst at dstOff: dst.CopyFrom
// when dst is a CUDA buffer, else through the page-locked staging buffers
// straight into dst.WriteAt (one copy fewer than gpu.Copy's generic path).
// done is false when dst is a buffer of another driver instance. Errors: as
// CopyFrom, and dst's.
func (b *buffer) CopyTo(srcOff int64, dst gpu.Buffer, dstOff, n int64) (done bool, err error) {
	if d, ok := dst.(*buffer); ok {
		return d.CopyFrom(dstOff, b, srcOff, n)
	}
	if err := checkRange(b.size, srcOff, n); err != nil {
		return true, err
	}
	if err := checkRange(dst.Size(), dstOff, n); err != nil {
		return true, err
	}
	if n == 0 {
		return true, nil
	}
	if err := b.rlock(); err != nil {
		return true, err
	}
	defer b.mu.RUnlock()
	return true, b.dev.dtohTo(dst, dstOff, b.ptr(srcOff), n)
}

// lockPair takes two buffers for I/O in a fixed order (their sequence
// numbers), so that two opposite copies with a Free waiting on each side
// cannot deadlock.
func lockPair(a, b *buffer) (unlock func(), err error) {
	if a == b {
		if err := a.rlock(); err != nil {
			return nil, err
		}
		return a.mu.RUnlock, nil
	}
	first, second := a, b
	if second.seq < first.seq {
		first, second = second, first
	}
	if err := first.rlock(); err != nil {
		return nil, err
	}
	if err := second.rlock(); err != nil {
		first.mu.RUnlock()
		return nil, err
	}
	return func() { second.mu.RUnlock(); first.mu.RUnlock() }, nil
}

func checkRange(size, off, n int64) error {
	if off < 0 || n < 0 || off > size || n > size-off {
		return fmt.Errorf("range [%d, +%d) of a %d-byte buffer: %w", off, n, size, gpu.ErrInvalidSize)
	}
	return nil
}
