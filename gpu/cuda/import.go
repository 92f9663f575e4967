package cuda

import (
	"errors"
	"fmt"
	"sync"

	"github.com/tensorfs/tensorfs/gpu"
	"github.com/tensorfs/tensorfs/ipc"
)

var _ gpu.Importer = (*Device)(nil)

// exports maps the IPC handle of every live allocation of this process (any
// device) to it. cuIpcOpenMemHandle refuses a handle exported by the calling
// process (CUDA_ERROR_INVALID_CONTEXT), yet a daemon is asked to import its
// own tensors (a manual registration of a handle it handed out, a local copy
// between two files); the map turns that into an alias of the allocation.
// Handles are unique among live allocations (the driver gives new memory a
// new handle), so a lookup by handle names exactly one allocation.
var exports = struct {
	sync.Mutex
	m map[string]*allocation
}{m: map[string]*allocation{}}

// mapping is one cuIpcOpenMemHandle of a handle in a device's context,
// shared by every buffer imported from that handle on that device: the
// driver maps an allocation once per context, and an open costs
// milliseconds, so a second Import of a handle still open reuses it.
type mapping struct {
	handle string
	ptr    devptr // cuIpcOpenMemHandle's pointer: the exporter's offset 0
	avail  int64  // bytes from ptr to the end of the allocation
	refs   int    // buffers imported from it and not yet freed (Device.imu)
	closed bool   // unmapped by Device.Close with buffers still imported
}

// parseHandle decodes "cuda:" + 128 hex digits (either case) with the one
// handle parser, ipc.ParseHandle. Errors: gpu.ErrHandle, saying what is
// wrong.
func parseHandle(handle string) (ipcHndl, error) {
	h, err := ipc.ParseHandle(handle)
	if err == nil && h.Kind != ipc.KindCUDA {
		err = fmt.Errorf("a %s handle", h.Kind)
	}
	if err != nil {
		return ipcHndl{}, fmt.Errorf("not a CUDA IPC handle (cuda: + %d hex digits): %v: %w", 2*ipc.CUDAHandleSize, err, gpu.ErrHandle)
	}
	return ipcHndl(h.CUDA), nil
}

// clip shortens a caller's string for an error message.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// importRange checks [off, off+n) against an allocation of avail bytes
// (n == 0: to its end) and returns the buffer's size. Errors:
// gpu.ErrInvalidSize, also for an empty result.
func importRange(avail, off, n int64) (int64, error) {
	if off < 0 || n < 0 || off > avail || n > avail-off || (n == 0 && off == avail) {
		return 0, fmt.Errorf("import [%d, +%d) of a %d-byte allocation: %w", off, n, avail, gpu.ErrInvalidSize)
	}
	if n == 0 {
		n = avail - off
	}
	return n, nil
}

// Import implements gpu.Importer: it maps the allocation behind handle
// ("cuda:" + 128 hex digits, as Buffer.Handle gives it) into this device's
// context with cuIpcOpenMemHandle_v2 (peer access enabled lazily, so the
// memory may live on another GPU) and returns [off, off+n) of it, n == 0
// meaning to the allocation's end (cuMemGetAddressRange_v2 gives its size).
// The buffer reads, writes, zeroes and copies like one from Alloc (staged
// through page-locked memory; device to device or peer with other CUDA
// buffers, imported ones included); ID is new, Offset is off, Handle is the
// handle (lowercase), and it does not count in MemInfo. Free closes the
// mapping once no buffer imported from it on this device is left.
//
// A handle of an allocation this process made (any device) is not opened
// (the driver refuses a process its own handles): the buffer aliases the
// allocation, its Device is the device that holds it, and that memory is
// kept until the alias is freed even when its owner frees it first.
//
// Errors: gpu.ErrHandle for a malformed handle or one the driver does not
// open (wrapping its *Error: CUDA_ERROR_INVALID_CONTEXT for a handle this
// process exported through RawAllocExport, CUDA_ERROR_INVALID_VALUE or
// CUDA_ERROR_INVALID_HANDLE for memory already freed), gpu.ErrInvalidSize
// for a range outside the allocation, gpu.ErrFreed after Close. Nothing is
// left open on error.
func (d *Device) Import(handle string, off, n int64) (gpu.Buffer, error) {
	raw, err := parseHandle(handle)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d.name, err)
	}
	if off < 0 || n < 0 {
		return nil, fmt.Errorf("%s: import [%d, +%d): %w", d.name, off, n, gpu.ErrInvalidSize)
	}
	if d.closed.Load() {
		return nil, fmt.Errorf("%s is closed: %w", d.name, gpu.ErrFreed)
	}
	canon := ipc.Handle{Kind: ipc.KindCUDA, CUDA: raw}.String()
	if b, err, ok := importLocal(canon, off, n); ok {
		return b, err
	}
	m, err := d.openMapping(canon, raw)
	if err != nil {
		return nil, err
	}
	size, err := importRange(m.avail, off, n)
	if err != nil {
		if cerr := d.closeMapping(m); cerr != nil {
			return nil, errors.Join(fmt.Errorf("%s: %w", d.name, err), cerr)
		}
		return nil, fmt.Errorf("%s: %w", d.name, err)
	}
	a := &allocation{base: m.ptr, size: m.avail, id: newAllocID(), handle: canon, imp: m}
	return &buffer{dev: d, a: a, off: off, size: size, span: size, seq: bufferSeq.Add(1)}, nil
}

// importLocal returns an alias of this process's allocation named by
// handle; ok is false when no live allocation has that handle.
func importLocal(handle string, off, n int64) (b gpu.Buffer, err error, ok bool) {
	exports.Lock()
	defer exports.Unlock()
	o := exports.m[handle]
	if o == nil {
		return nil, nil, false
	}
	size, err := importRange(o.size, off, n)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.dev.name, err), true
	}
	o.pins++
	a := &allocation{base: o.base, size: o.size, id: newAllocID(), handle: handle, alias: o}
	return &buffer{dev: o.dev, a: a, off: off, size: size, span: size, seq: bufferSeq.Add(1)}, nil, true
}

// unpin drops an alias's hold on o, freeing o when its owner already did.
func unpin(o *allocation) error {
	exports.Lock()
	o.pins--
	last := o.pins == 0 && o.dead
	exports.Unlock()
	if last {
		return o.dev.freeAllocation(o)
	}
	return nil
}

// openMapping returns the device's mapping of handle, opening it when none
// is open. imu is held across the open (milliseconds), so that two Imports
// of one handle never open it twice in one context.
func (d *Device) openMapping(handle string, raw ipcHndl) (*mapping, error) {
	d.imu.Lock()
	defer d.imu.Unlock()
	if m := d.maps[handle]; m != nil {
		m.refs++
		return m, nil
	}
	var m *mapping
	err := d.withCtx(func() error {
		p, r := d.drv.ipcOpenMemHandle(raw)
		if err := check(d.drv, "cuIpcOpenMemHandle_v2", r); err != nil {
			return err
		}
		base, size, r := d.drv.memGetAddressRange(p)
		if err := check(d.drv, "cuMemGetAddressRange_v2", r); err != nil {
			d.drv.ipcCloseMemHandle(p)
			return err
		}
		end := uint64(base) + size
		if uint64(p) < uint64(base) || uint64(p) >= end {
			d.drv.ipcCloseMemHandle(p)
			return fmt.Errorf("cuMemGetAddressRange_v2: %#x is not inside [%#x, +%d)", p, base, size)
		}
		m = &mapping{handle: handle, ptr: p, avail: int64(end - uint64(p)), refs: 1}
		return nil
	})
	if err != nil {
		why := ""
		var ce *Error
		if errors.As(err, &ce) && result(ce.Code) == errInvalidContext {
			why = " (exported by this process outside tensorfs's allocator? the driver refuses a process its own handles)"
		}
		return nil, fmt.Errorf("%s: import %s...%s: %w: %w", d.name, handle[:21], why, gpu.ErrHandle, err)
	}
	d.maps[handle] = m
	return m, nil
}

// closeMapping drops one buffer's reference to m and unmaps it after the
// last one. imu stays held across the close, so that an Import of the same
// handle meanwhile waits and opens it afresh.
func (d *Device) closeMapping(m *mapping) error {
	d.imu.Lock()
	defer d.imu.Unlock()
	if m.refs--; m.refs > 0 || m.closed {
		return nil
	}
	delete(d.maps, m.handle)
	err := d.withCtx(func() error {
		return check(d.drv, "cuIpcCloseMemHandle", d.drv.ipcCloseMemHandle(m.ptr))
	})
	if err != nil {
		return fmt.Errorf("%s: close import %s...: %w", d.name, m.handle[:21], err)
	}
	return nil
}

// closeMappings unmaps what imported buffers left open at Close and says
// how many there were (they must be freed first, like every buffer).
func (d *Device) closeMappings() error {
	d.imu.Lock()
	defer d.imu.Unlock()
	if len(d.maps) == 0 {
		return nil
	}
	n := len(d.maps)
	for h, m := range d.maps {
		d.withCtx(func() error { return check(d.drv, "cuIpcCloseMemHandle", d.drv.ipcCloseMemHandle(m.ptr)) })
		m.closed = true
		delete(d.maps, h)
	}
	return fmt.Errorf("%s closed with %d IPC imports still open", d.name, n)
}
