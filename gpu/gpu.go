// Package gpu is tensorfs's device-memory layer: one Device interface for every
// backend (host memory from memfd today, CUDA device memory through the driver API),
// each allocation a Buffer that can be read, written, copied and exported to other
// processes. It knows nothing of FUSE and returns ordinary errors.
package gpu

import (
	"errors"
	"fmt"
)

// Sentinel errors returned (wrapped) by every backend; match them with errors.Is.
var (
	// ErrOutOfMemory: the allocation does not fit the device's capacity or the
	// --max-memory cap. The filesystem maps it to ENOSPC.
	ErrOutOfMemory = errors.New("out of device memory")
	// ErrInvalidSize: a size or offset that is negative, zero where a size is
	// needed, or outside the buffer. The filesystem maps it to EINVAL.
	ErrInvalidSize = errors.New("invalid size or offset")
	// ErrNoDevice: a device name that no backend of this daemon serves
	// (e.g. "cuda:7" on a host with one GPU). The filesystem maps it to EINVAL.
	ErrNoDevice = errors.New("no such device")
	// ErrNoDriver: the backend's driver library (libcuda.so.1) is not present.
	ErrNoDriver = errors.New("device driver not available")
	// ErrFreed: the buffer was already freed.
	ErrFreed = errors.New("buffer already freed")
)

// MemInfo is a device's memory as tensorfs sees it, in bytes.
type MemInfo struct {
	// Total is the capacity tensorfs may use: the device's memory, or the
	// --max-memory cap when that is smaller.
	Total int64
	// Used is the bytes tensorfs holds on the device now (allocations, not
	// tensor sizes). It is 0 when nothing is allocated.
	Used int64
}

// Device is one memory device: "host" or "cuda:N". Implementations are safe for
// concurrent use.
type Device interface {
	// Name is the device's canonical name, as written in the device xattr.
	Name() string
	// Alloc returns a zeroed buffer of exactly nbytes (> 0) bytes whose memory is
	// committed now, so running out is ErrOutOfMemory here, never a fault later.
	// A backend may carve small buffers out of a larger exported allocation
	// (see Buffer.Offset), but never puts buffers of different owners (uids) in
	// one allocation: its IPC handle grants access to all of it.
	// Errors: ErrInvalidSize for nbytes <= 0, ErrOutOfMemory.
	Alloc(nbytes int64, owner uint32) (Buffer, error)
	// MemInfo reports capacity and use, in bytes.
	MemInfo() MemInfo
	// Close frees what the device itself holds (caches, pools, contexts). Buffers
	// must be freed first.
	Close() error
}

// UninitAllocator is implemented by a Device that can hand out recycled
// memory without clearing it first, for a caller that overwrites every one
// of the nbytes before anything can read them (a copy's destination, which
// no reader sees until it is complete). Such memory holds bytes that an
// earlier buffer of the same owner left, never another owner's: memory the
// backend cannot vouch for (fresh from the driver, or a shared arena) is
// still zeroed, as are the bytes past nbytes that an import of the
// allocation could read. Same errors as Device.Alloc.
type UninitAllocator interface {
	AllocUninit(nbytes int64, owner uint32) (Buffer, error)
}

// AllocUninit allocates nbytes on dev for a caller that overwrites all of
// them before anything reads them: dev's UninitAllocator when it has one
// (skipping the zeroing of recycled memory: 1 GiB is about 0.3 ms of
// cuMemsetD8 on an H200), else dev.Alloc.
func AllocUninit(dev Device, nbytes int64, owner uint32) (Buffer, error) {
	if u, ok := dev.(UninitAllocator); ok {
		return u.AllocUninit(nbytes, owner)
	}
	return dev.Alloc(nbytes, owner)
}

// Buffer is one committed allocation on a device.
type Buffer interface {
	// ID identifies the exported allocation the buffer lives in (several
	// buffers may share one); unique for the process's life, never reused, so
	// importers can key their caches by it.
	ID() uint64
	// Offset is the buffer's byte offset inside that allocation (0 when the
	// buffer is the whole allocation): the ipc_offset of the tensor.
	Offset() int64
	// Device is the device that owns the buffer.
	Device() Device
	// Size is the buffer's length in bytes.
	Size() int64
	// Addr is the buffer's first byte in the device's address space (a host
	// virtual address for host memory, a CUdeviceptr for CUDA), for memory
	// region registration.
	Addr() uintptr
	// ReadAt copies len(p) bytes at byte offset off into p. It fails with
	// ErrInvalidSize when [off, off+len(p)) is not inside the buffer.
	ReadAt(p []byte, off int64) (int, error)
	// WriteAt copies p to byte offset off, with the same bounds as ReadAt.
	WriteAt(p []byte, off int64) (int, error)
	// Zero sets n bytes at off to 0.
	Zero(off, n int64) error
	// Handle is the IPC handle another process opens to map this allocation:
	// "memfd:/proc/PID/fd/N" for host memory, "cuda:" + 128 hex digits for CUDA.
	Handle() string
	// Free releases the buffer (the allocation once no buffer uses it). A
	// second Free returns ErrFreed.
	Free() error
}

// Copy copies n bytes from src at srcOff to dst at dstOff, device to device
// where both sides allow it. Errors: ErrInvalidSize for ranges outside either
// buffer, or whatever the backend reports.
func Copy(dst Buffer, dstOff int64, src Buffer, srcOff int64, n int64) error {
	// checkRange, not off+n > size: offsets can come from a peer (an IPC
	// descriptor), and a sum that wraps would pass.
	if checkRange(src.Size(), srcOff, n) != nil || checkRange(dst.Size(), dstOff, n) != nil {
		return fmt.Errorf("copy %d bytes from %d/%d to %d/%d: %w", n, srcOff, src.Size(), dstOff, dst.Size(), ErrInvalidSize)
	}
	if n == 0 {
		return nil
	}
	if c, ok := dst.(DirectCopier); ok {
		if done, err := c.CopyFrom(dstOff, src, srcOff, n); done {
			return err
		}
	}
	if c, ok := src.(DirectCopierTo); ok {
		if done, err := c.CopyTo(srcOff, dst, dstOff, n); done {
			return err
		}
	}
	// Generic path: stage through host memory in bounded chunks.
	const chunk = 4 << 20
	tmp := make([]byte, min(n, chunk))
	for done := int64(0); done < n; {
		m := min(n-done, int64(len(tmp)))
		if _, err := src.ReadAt(tmp[:m], srcOff+done); err != nil {
			return err
		}
		if _, err := dst.WriteAt(tmp[:m], dstOff+done); err != nil {
			return err
		}
		done += m
	}
	return nil
}

// DirectCopier is implemented by buffers that have a direct path from some
// sources (host memmove, CUDA device-to-device or peer copies). Copy calls it
// with a range already checked; done=false means "not from this source: use
// the generic path".
type DirectCopier interface {
	CopyFrom(dstOff int64, src Buffer, srcOff, n int64) (done bool, err error)
}

// DirectCopierTo is DirectCopier from the source's side (CUDA to host through
// its pinned staging buffers).
type DirectCopierTo interface {
	CopyTo(srcOff int64, dst Buffer, dstOff, n int64) (done bool, err error)
}

func checkRange(size, off, n int64) error {
	if off < 0 || n < 0 || off > size || n > size-off {
		return fmt.Errorf("range [%d, +%d) of a %d-byte buffer: %w", off, n, size, ErrInvalidSize)
	}
	return nil
}
