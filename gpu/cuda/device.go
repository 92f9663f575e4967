// Package cuda is tensorfs's CUDA backend: device memory of NVIDIA GPUs
// through the driver API, with libcuda.so.1 loaded at run time (purego), so
// one CGO_ENABLED=0 binary serves host memory everywhere and GPUs where the
// driver is installed.
//
// Each GPU is a gpu.Device named "cuda:N". Buffers under ArenaSize are carved
// from ArenaSize arenas, one set per owner uid, each exported once with
// cuIpcGetMemHandle; larger buffers get allocations of their own. Reads and
// writes go through page-locked staging buffers, double-buffered so that the
// copy into or out of the caller's memory overlaps the DMA. Device.Import
// maps another process's exported allocation (cuIpcOpenMemHandle) as a
// buffer that works like these.
//
// Threads: a CUDA context is current per OS thread, and goroutines move
// between threads. Every driver call that needs the device's context runs
// inside Device.withCtx, which locks the goroutine to its thread and makes
// the device's primary context current on it first (cuCtxSetCurrent is a
// thread-local store, cheap enough to do every time), so any goroutine may
// call a Device or Buffer method and no context is ever assumed current.
package cuda

import (
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorfs/tensorfs/gpu"
)

const (
	// stageSize is the size in bytes of each of a stager's two page-locked
	// buffers: a FUSE request (at most 1 MiB) fits in one.
	stageSize = 1 << 20
	// arenaLinger is how long an owner's last empty arena is kept before it
	// is freed: long enough for a create/unlink loop to reuse it, short
	// enough that an idle daemon soon holds nothing (statfs used 0).
	arenaLinger = 250 * time.Millisecond
	// maxStagers bounds the page-locked memory and streams of one device:
	// this many transfers run at once, later ones wait for a stager.
	maxStagers = 8
)

// newAllocID numbers allocations from the process-wide counter every backend
// shares, so ids never collide across devices and are never reused.
func newAllocID() uint64 { return gpu.NewAllocID() }

// Device is one GPU, "cuda:N". It implements gpu.Device; its methods are safe
// for concurrent use.
type Device struct {
	drv     driver
	ordinal int
	name    string
	dev     cuDev
	ctx     cuCtx // the device's primary context, retained until Close
	total   int64 // device memory in bytes (cuMemGetInfo's total)

	limit atomic.Int64 // capacity tensorfs may use, bytes
	used  atomic.Int64 // bytes of allocations held, arenas whole

	amu   sync.Mutex // guards pools and every arena's free list, and spares
	pools pools
	// spares are freed whole allocations kept for d.linger for the next
	// allocation of the same size and owner (a copy that replaces a large
	// tensor frees one and allocates one: cuMemFree, cuMemAlloc and
	// cuIpcGetMemHandle cost about 1 ms a GiB each). Counted in used, like
	// lingering arenas; at most a quarter of the cap.
	spares     []*allocation
	spareBytes int64

	smu      sync.Mutex
	stagers  chan *stager // idle stagers
	nstagers int          // stagers made so far (idle or in use)

	pmu    sync.Mutex
	peers  map[*Device]error // peer access from this device's context, once per peer
	peerOn map[*Device]bool  // peers whose memory this device's context addresses directly

	imu  sync.Mutex          // guards maps, and is held across cuIpcOpen/CloseMemHandle
	maps map[string]*mapping // open IPC mappings in this device's context, by handle

	linger time.Duration // how long an idle arena is kept (arenaLinger)

	// The scatter kernel (batch.go), loaded into the primary context at the
	// first batch and unloaded at Close; a failed load is kept (kerr), and
	// batches then go through the copy engine.
	kmu     sync.Mutex
	kloaded bool
	kmod    cuMod
	kfn     cuFunc
	kerr    error

	closed atomic.Bool
}

var _ gpu.Device = (*Device)(nil)

// Open loads libcuda.so.1 and returns one Device per GPU, in ordinal order,
// each retaining its primary context. maxMemory (bytes) caps each device's
// capacity; 0 means the device's whole memory. Errors: gpu.ErrInvalidSize for
// a negative maxMemory, gpu.ErrNoDriver (wrapped, naming the library) when
// the library is missing, an error matching gpu.ErrNoDevice when there is no
// GPU, or the driver's *Error.
func Open(maxMemory int64) ([]gpu.Device, error) {
	if maxMemory < 0 {
		return nil, fmt.Errorf("max memory %d: %w", maxMemory, gpu.ErrInvalidSize)
	}
	drv, err := loadDriver()
	if err != nil {
		return nil, err
	}
	return open(drv, maxMemory)
}

// open is Open over any driver (the tests pass a fake).
func open(drv driver, maxMemory int64) ([]gpu.Device, error) {
	if err := check(drv, "cuInit", drv.init()); err != nil {
		return nil, err
	}
	n, r := drv.deviceGetCount()
	if err := check(drv, "cuDeviceGetCount", r); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("cuda: driver loaded but it sees no GPU: %w", gpu.ErrNoDevice)
	}
	var devs []gpu.Device
	for i := range n {
		d, err := openDevice(drv, i, maxMemory)
		if err != nil {
			for _, o := range devs {
				o.Close()
			}
			return nil, err
		}
		devs = append(devs, d)
	}
	return devs, nil
}

func openDevice(drv driver, ordinal int, maxMemory int64) (*Device, error) {
	name := fmt.Sprintf("cuda:%d", ordinal)
	dev, r := drv.deviceGet(ordinal)
	if err := check(drv, "cuDeviceGet", r); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	ctx, r := drv.primaryCtxRetain(dev)
	if err := check(drv, "cuDevicePrimaryCtxRetain", r); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	d := &Device{
		drv: drv, ordinal: ordinal, name: name, dev: dev, ctx: ctx,
		pools:   pools{},
		stagers: make(chan *stager, maxStagers),
		peers:   map[*Device]error{},
		peerOn:  map[*Device]bool{},
		maps:    map[string]*mapping{},
		linger:  arenaLinger,
	}
	var total uint64
	err := d.withCtx(func() error {
		var r result
		_, total, r = drv.memGetInfo()
		return check(drv, "cuMemGetInfo_v2", r)
	})
	if err != nil {
		drv.primaryCtxRelease(dev)
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	d.total = int64(total)
	d.SetMaxMemory(maxMemory)
	return d, nil
}

// withCtx runs fn locked to the calling goroutine's OS thread with the
// device's primary context current on that thread: the driver's calls act
// on the thread's current context, and without the lock the goroutine could
// move to a thread where another device's context (or none) is current
// between cuCtxSetCurrent and the call.
func (d *Device) withCtx(fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := check(d.drv, "cuCtxSetCurrent", d.drv.ctxSetCurrent(d.ctx)); err != nil {
		return fmt.Errorf("%s: %w", d.name, err)
	}
	return fn()
}

// Name implements gpu.Device: "cuda:N".
func (d *Device) Name() string { return d.name }

// Ordinal is the device's CUDA ordinal, N of "cuda:N".
func (d *Device) Ordinal() int { return d.ordinal }

// MemInfo implements gpu.Device. Total is the device's memory or the cap,
// whichever is smaller; Used counts whole allocations (arenas included, each
// ArenaSize bytes, an owner's last empty arena and freed large allocations
// for the 250 ms they linger for reuse), so it drops to 0 once no buffer has
// been held for that long.
func (d *Device) MemInfo() gpu.MemInfo {
	return gpu.MemInfo{Total: d.limit.Load(), Used: d.used.Load()}
}

// SetMaxMemory caps the bytes tensorfs may allocate on the device; 0 (or a
// cap larger than the device) means the device's whole memory. A cap below
// what is held now only refuses new allocations. Errors: gpu.ErrInvalidSize
// for a negative cap.
func (d *Device) SetMaxMemory(maxMemory int64) error {
	if maxMemory < 0 {
		return fmt.Errorf("max memory %d: %w", maxMemory, gpu.ErrInvalidSize)
	}
	if maxMemory == 0 || maxMemory > d.total {
		maxMemory = d.total
	}
	d.limit.Store(maxMemory)
	return nil
}

// reserve accounts n bytes against the cap before the driver is asked, so
// that concurrent allocations cannot overshoot it together.
func (d *Device) reserve(n int64) error {
	for {
		u, l := d.used.Load(), d.limit.Load()
		if n > l-u {
			return fmt.Errorf("%s: %d bytes with %d of %d in use: %w", d.name, n, u, l, gpu.ErrOutOfMemory)
		}
		if d.used.CompareAndSwap(u, u+n) {
			return nil
		}
	}
}

// Alloc implements gpu.Device: exactly nbytes of zeroed device memory, carved
// from one of owner's arenas when nbytes < ArenaSize, else an allocation of
// its own rounded up to ArenaSize. Errors: gpu.ErrInvalidSize for nbytes <= 0,
// gpu.ErrOutOfMemory (the cap, or the driver's CUDA_ERROR_OUT_OF_MEMORY, an
// *Error) with nothing leaked, gpu.ErrFreed after Close, or the driver's *Error.
func (d *Device) Alloc(nbytes int64, owner uint32) (gpu.Buffer, error) {
	if nbytes <= 0 || nbytes > 1<<62 {
		return nil, fmt.Errorf("%s alloc of %d bytes: %w", d.name, nbytes, gpu.ErrInvalidSize)
	}
	if d.closed.Load() {
		return nil, fmt.Errorf("%s is closed: %w", d.name, gpu.ErrFreed)
	}
	if nbytes >= ArenaSize {
		return d.allocWhole(nbytes, owner, false)
	}
	return d.allocPiece(nbytes, owner)
}

// AllocUninit implements gpu.UninitAllocator: a whole allocation of owner
// kept from an earlier free is handed out without clearing its first nbytes
// (its tail past nbytes is cleared). Memory fresh from cuMemAlloc may hold
// bytes of another owner's freed allocation, and arena pieces share an
// arena whose ranges are not tracked, so both are zeroed as by Alloc.
func (d *Device) AllocUninit(nbytes int64, owner uint32) (gpu.Buffer, error) {
	if nbytes < ArenaSize || nbytes > 1<<62 || d.closed.Load() {
		return d.Alloc(nbytes, owner)
	}
	return d.allocWhole(nbytes, owner, true)
}

// allocWhole gives a large buffer an allocation of its own; with uninit, a
// recycled one keeps its first nbytes as they are.
func (d *Device) allocWhole(nbytes int64, owner uint32, uninit bool) (gpu.Buffer, error) {
	size := roundUp(nbytes, ArenaSize)
	a := d.takeWhole(size, owner)
	from := int64(0) // the bytes from here on are cleared
	if a != nil && uninit {
		from = nbytes
	}
	var err error
	if a == nil {
		a, err = d.newAllocation(size, owner, false)
	}
	if errors.Is(err, gpu.ErrOutOfMemory) {
		if n, _ := d.flushIdle(); n > 0 {
			a, err = d.newAllocation(size, owner, false)
		}
	}
	if err != nil {
		return nil, err
	}
	b := &buffer{dev: d, a: a, size: nbytes, span: a.size, seq: bufferSeq.Add(1)}
	if from < a.size {
		if err := d.zero(a.base+devptr(from), a.size-from); err != nil {
			d.freeAllocation(a)
			return nil, err
		}
	}
	return b, nil
}

// allocPiece carves a small buffer from one of owner's arenas, making a new
// arena when none has room.
func (d *Device) allocPiece(nbytes int64, owner uint32) (gpu.Buffer, error) {
	span := roundUp(nbytes, Align)
	d.amu.Lock()
	a, off := d.pools.take(owner, span)
	if a == nil {
		// The lock is held across the driver call (tens of µs) so that
		// concurrent small allocations wait for this arena rather than each
		// making one of their own.
		na, err := d.newAllocation(ArenaSize, owner, true)
		if errors.Is(err, gpu.ErrOutOfMemory) {
			if n, _ := d.reclaimIdleLocked(); n > 0 {
				na, err = d.newAllocation(ArenaSize, owner, true)
			}
		}
		if err != nil {
			d.amu.Unlock()
			return nil, err
		}
		d.pools.add(na)
		a, off = d.pools.take(owner, span)
	}
	d.amu.Unlock()
	b := &buffer{dev: d, a: a, off: off, size: nbytes, span: span, seq: bufferSeq.Add(1)}
	// A reused range holds a freed tensor's bytes: zero all of it, padding
	// included, since an importer maps the whole arena.
	if err := d.zero(a.base+devptr(off), span); err != nil {
		d.release(a, off, span)
		return nil, err
	}
	return b, nil
}

// newAllocation reserves size bytes against the cap, allocates them and
// exports them for IPC; on any failure nothing is held.
func (d *Device) newAllocation(size int64, owner uint32, arena bool) (*allocation, error) {
	if err := d.reserve(size); err != nil {
		return nil, err
	}
	a := &allocation{size: size, owner: owner, arena: arena, pidx: -1}
	err := d.withCtx(func() error {
		p, r := d.drv.memAlloc(uint64(size))
		if err := check(d.drv, "cuMemAlloc_v2", r); err != nil {
			return err
		}
		h, r := d.drv.ipcGetMemHandle(p)
		if r != success {
			// Say what the driver thinks p is: how the out parameter
			// that call lost (a pointer of 0 from a cuMemAlloc_v2 that
			// succeeded; lib.go, call) was found.
			base, rsize, rr := d.drv.memGetAddressRange(p)
			d.drv.memFree(p)
			return fmt.Errorf("%w (pointer %#x: allocation %#x of %d bytes, cuMemGetAddressRange result %d)", check(d.drv, "cuIpcGetMemHandle", r), p, base, rsize, rr)
		}
		a.base, a.handle = p, "cuda:"+hex.EncodeToString(h[:])
		return nil
	})
	if err != nil {
		d.used.Add(-size)
		return nil, fmt.Errorf("%s: allocate %d bytes: %w", d.name, size, err)
	}
	a.id, a.dev = newAllocID(), d
	exports.Lock()
	exports.m[a.handle] = a
	exports.Unlock()
	return a, nil
}

// freeAllocation gives an allocation back to the driver and the cap. While
// buffers imported from it by this process (aliases) are live, the memory
// is kept (still counted in Used) and the last alias's Free frees it: an
// importer's mapping keeps memory alive, and an alias must act like one.
func (d *Device) freeAllocation(a *allocation) error {
	exports.Lock()
	if exports.m[a.handle] == a {
		delete(exports.m, a.handle) // no new alias of memory being freed
	}
	if a.pins > 0 {
		a.dead = true
		exports.Unlock()
		return nil
	}
	exports.Unlock()
	err := d.withCtx(func() error {
		return check(d.drv, "cuMemFree_v2", d.drv.memFree(a.base))
	})
	d.used.Add(-a.size)
	if err != nil {
		return fmt.Errorf("%s: free allocation %d: %w", d.name, a.id, err)
	}
	return nil
}

// release returns a buffer's range: to its arena, or, for a large buffer,
// the whole allocation to the driver. An arena left empty is freed, except
// one per owner, which lingers (still counted in Used) and is freed when it
// has stayed empty for d.linger.
func (d *Device) release(a *allocation, off, span int64) error {
	if !a.arena {
		if d.keepWhole(a) {
			return nil
		}
		return d.freeAllocation(a)
	}
	d.amu.Lock()
	if !d.pools.give(a, off, span) {
		d.amu.Unlock()
		return nil
	}
	if p := d.pools[a.owner]; d.linger > 0 && !d.closed.Load() && (p.idle == nil || p.idle == a) {
		p.idle = a
		a.idleGen++
		gen := a.idleGen
		d.amu.Unlock()
		time.AfterFunc(d.linger, func() { d.expire(a, gen) })
		return nil
	}
	d.pools.drop(a)
	d.amu.Unlock()
	return d.freeAllocation(a)
}

// keepWhole parks a freed whole allocation among the spares for d.linger;
// false when it is not kept (linger off, closing, aliases of it live, or
// the spares are full).
func (d *Device) keepWhole(a *allocation) bool {
	if d.linger <= 0 || d.closed.Load() {
		return false
	}
	exports.Lock()
	if a.pins > 0 {
		exports.Unlock()
		return false
	}
	if exports.m[a.handle] == a {
		delete(exports.m, a.handle) // no alias of a spare
	}
	exports.Unlock()
	d.amu.Lock()
	if d.spareBytes+a.size > d.limit.Load()/4 {
		d.amu.Unlock()
		return false
	}
	a.idleGen++
	gen := a.idleGen
	d.spares = append(d.spares, a)
	d.spareBytes += a.size
	d.amu.Unlock()
	time.AfterFunc(d.linger, func() { d.expireWhole(a, gen) })
	return true
}

// takeWhole returns a spare of exactly size bytes of owner, with a new
// allocation id (importers key their caches by it: the memory is another
// allocation now), or nil.
func (d *Device) takeWhole(size int64, owner uint32) *allocation {
	d.amu.Lock()
	i := slices.IndexFunc(d.spares, func(a *allocation) bool { return a.size == size && a.owner == owner })
	if i < 0 {
		d.amu.Unlock()
		return nil
	}
	a := d.spares[i]
	d.spares = slices.Delete(d.spares, i, i+1)
	d.spareBytes -= a.size
	a.idleGen++ // its expiry timer finds it taken
	d.amu.Unlock()
	a.id = newAllocID()
	exports.Lock()
	exports.m[a.handle] = a
	exports.Unlock()
	return a
}

// expireWhole frees a spare still parked since gen.
func (d *Device) expireWhole(a *allocation, gen uint64) {
	d.amu.Lock()
	i := slices.Index(d.spares, a)
	if i < 0 || a.idleGen != gen {
		d.amu.Unlock()
		return
	}
	d.spares = slices.Delete(d.spares, i, i+1)
	d.spareBytes -= a.size
	d.amu.Unlock()
	if err := d.freeAllocation(a); err != nil {
		slog.Error("free allocation failed", "device", d.name, "err", err)
	}
}

// expire frees an idle arena that stayed empty since it became idle (gen).
func (d *Device) expire(a *allocation, gen uint64) {
	d.amu.Lock()
	p := d.pools[a.owner]
	if p == nil || p.idle != a || a.idleGen != gen || a.inUse != 0 {
		d.amu.Unlock()
		return
	}
	d.pools.drop(a)
	d.amu.Unlock()
	if err := d.freeAllocation(a); err != nil {
		slog.Error("free allocation failed", "device", d.name, "err", err)
	}
}

// flushIdle frees every idle arena now and returns how many it freed.
func (d *Device) flushIdle() (int, error) {
	d.amu.Lock()
	defer d.amu.Unlock()
	return d.reclaimIdleLocked()
}

// reclaimIdleLocked frees every idle arena (d.amu is held: the driver's
// cuMemFree takes no lock of ours). An allocation that does not fit calls it
// before giving up, so lingering arenas never cost an ENOSPC.
func (d *Device) reclaimIdleLocked() (int, error) {
	var idle []*allocation
	for _, p := range d.pools {
		if p.idle != nil && p.idle.inUse == 0 {
			idle = append(idle, p.idle)
		}
	}
	var first error
	for _, a := range idle {
		d.pools.drop(a)
		if err := d.freeAllocation(a); err != nil && first == nil {
			first = err
		}
	}
	spares := d.spares
	d.spares, d.spareBytes = nil, 0
	for _, a := range spares {
		a.idleGen++
		if err := d.freeAllocation(a); err != nil && first == nil {
			first = err
		}
	}
	return len(idle) + len(spares), first
}

// Close implements gpu.Device: it frees the staging buffers, streams and
// batch descriptor arrays, unloads the scatter kernel's module, and releases the primary context (which frees any device memory still held).
// Errors: the first driver error, or one saying how many bytes were still
// allocated (buffers must be freed first). A second Close does nothing.
func (d *Device) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	if _, err := d.flushIdle(); err != nil {
		keep(err)
	}
	d.smu.Lock()
	for n := d.nstagers; n > 0; n-- {
		s := <-d.stagers // every stager is idle again once no call is running
		if err := d.withCtx(func() error { return s.destroy(d.drv) }); err != nil {
			keep(err)
		}
	}
	d.nstagers = 0
	d.smu.Unlock()
	if err := d.unloadKernel(); err != nil {
		keep(err)
	}
	if u := d.used.Load(); u != 0 {
		keep(fmt.Errorf("%s closed with %d bytes still allocated", d.name, u))
	}
	if err := d.closeMappings(); err != nil {
		keep(err)
	}
	if err := check(d.drv, "cuDevicePrimaryCtxRelease_v2", d.drv.primaryCtxRelease(d.dev)); err != nil {
		keep(fmt.Errorf("%s: %w", d.name, err))
	}
	return first
}

// RawAllocExport is the floor that tensorfs's registration is measured
// against: one cuMemAlloc_v2 of n bytes and one cuIpcGetMemHandle, nothing
// else (no zeroing, no accounting, no cap). It returns the handle ("cuda:" +
// 128 hex digits) and a function that frees the memory. Errors: the
// driver's *Error.
func (d *Device) RawAllocExport(n int64) (handle string, free func() error, err error) {
	var p devptr
	err = d.withCtx(func() error {
		var r result
		if p, r = d.drv.memAlloc(uint64(n)); r != success {
			return check(d.drv, "cuMemAlloc_v2", r)
		}
		h, r := d.drv.ipcGetMemHandle(p)
		if r != success {
			d.drv.memFree(p)
			return check(d.drv, "cuIpcGetMemHandle", r)
		}
		handle = "cuda:" + hex.EncodeToString(h[:])
		return nil
	})
	if err != nil {
		return "", nil, err
	}
	return handle, func() error {
		return d.withCtx(func() error { return check(d.drv, "cuMemFree_v2", d.drv.memFree(p)) })
	}, nil
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }
