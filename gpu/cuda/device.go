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
	"log"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

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

	pmu   sync.Mutex
	peers map[*Device]error // peer access from this device's context, once per peer

	imu  sync.Mutex          // guards maps, and is held across cuIpcOpen/CloseMemHandle
	maps map[string]*mapping // open IPC mappings in this device's context, by handle

	linger time.Duration // how long an idle arena is kept (arenaLinger)

	closed atomic.Bool
}

var _ gpu.Device = (*Device)(nil)

// Probe loads the driver and counts the GPUs without creating any context:
// the cheap question "is there a GPU here?". Errors: gpu.ErrNoDriver when
// libcuda.so.1 is missing, or the driver's *Error (cuInit's
// CUDA_ERROR_NO_DEVICE matches gpu.ErrNoDevice).
func Probe() (int, error) {
	drv, err := loadDriver()
	if err != nil {
		return 0, err
	}
	if err := check(drv, "cuInit", drv.init()); err != nil {
		return 0, err
	}
	n, r := drv.deviceGetCount()
	return n, check(drv, "cuDeviceGetCount", r)
}

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
		if err := check(d.drv, "cuIpcGetMemHandle", r); err != nil {
			d.drv.memFree(p)
			return err
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
		log.Printf("%s: %v", d.name, err)
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
		log.Printf("%s: %v", d.name, err)
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

// Close implements gpu.Device: it frees the staging buffers and streams and
// releases the primary context (which frees any device memory still held).
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

// stager is a stream with two page-locked buffers: one is filled or drained
// by the CPU while the other's DMA runs.
type stager struct {
	stream cuStrm
	ptr    [2]unsafe.Pointer
	buf    [2][]byte
}

// getStager takes an idle stager, making one while fewer than maxStagers
// exist, else waiting for one. Call putStager when done.
func (d *Device) getStager() (*stager, error) {
	select {
	case s := <-d.stagers:
		return s, nil
	default:
	}
	d.smu.Lock()
	if d.nstagers < maxStagers {
		d.nstagers++
		d.smu.Unlock()
		s, err := d.newStager()
		if err != nil {
			d.smu.Lock()
			d.nstagers--
			d.smu.Unlock()
			return nil, err
		}
		return s, nil
	}
	d.smu.Unlock()
	return <-d.stagers, nil
}

func (d *Device) putStager(s *stager) { d.stagers <- s }

// newStager makes a stream and two staging buffers; they are kept until
// Close, because cuMemHostAlloc costs milliseconds (the kernel pins pages).
func (d *Device) newStager() (*stager, error) {
	s := &stager{}
	err := d.withCtx(func() error {
		st, r := d.drv.streamCreate()
		if err := check(d.drv, "cuStreamCreate", r); err != nil {
			return err
		}
		s.stream = st
		for i := range s.ptr {
			p, r := d.drv.memHostAlloc(stageSize)
			if err := check(d.drv, "cuMemHostAlloc", r); err != nil {
				s.destroy(d.drv)
				return err
			}
			s.ptr[i], s.buf[i] = p, unsafe.Slice((*byte)(p), stageSize)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: staging buffers: %w", d.name, err)
	}
	return s, nil
}

// destroy frees what the stager holds; the device's context is current.
func (s *stager) destroy(drv driver) error {
	var first error
	for i, p := range s.ptr {
		if p != nil {
			if err := check(drv, "cuMemFreeHost", drv.memFreeHost(p)); err != nil && first == nil {
				first = err
			}
			s.ptr[i], s.buf[i] = nil, nil
		}
	}
	if s.stream != 0 {
		if err := check(drv, "cuStreamDestroy_v2", drv.streamDestroy(s.stream)); err != nil && first == nil {
			first = err
		}
		s.stream = 0
	}
	return first
}

// withStager runs fn with a stager, in the device's context.
func (d *Device) withStager(fn func(s *stager) error) error {
	s, err := d.getStager()
	if err != nil {
		return err
	}
	defer d.putStager(s)
	return d.withCtx(func() error { return fn(s) })
}

// sync waits for the stager's stream; enqueue errors call it too, so that no
// DMA into a staging buffer outlives the call that started it.
func (d *Device) sync(s *stager) error {
	return check(d.drv, "cuStreamSynchronize", d.drv.streamSynchronize(s.stream))
}

// chunkSize splits a transfer of n bytes so that the CPU copy of one chunk
// overlaps the DMA of the next: four chunks for a FUSE-sized request, whole
// staging buffers for large ones, one chunk for small ones.
func chunkSize(n int64) int64 {
	return min(stageSize, max(64<<10, roundUp((n+3)/4, 4096)))
}

// htod copies p to device address dst through the staging buffers.
func (d *Device) htod(dst devptr, p []byte) error {
	return d.htodFunc(dst, int64(len(p)), func(stage []byte, off int64) error {
		copy(stage, p[off:])
		return nil
	})
}

// htodFrom copies n bytes of another backend's buffer to device address dst,
// reading them straight into the staging buffers.
func (d *Device) htodFrom(dst devptr, src gpu.Buffer, srcOff, n int64) error {
	return d.htodFunc(dst, n, func(stage []byte, off int64) error {
		_, err := src.ReadAt(stage, srcOff+off)
		return err
	})
}

// htodFunc copies n bytes to device address dst, chunk by chunk: fill puts
// the bytes at offset off of the transfer into a staging buffer, and its DMA
// is issued. Before a staging buffer is refilled the stream is synchronized,
// which waits for the DMA issued from it two chunks ago; the DMA of the other
// buffer (just issued) runs while the CPU fills this one.
func (d *Device) htodFunc(dst devptr, n int64, fill func(stage []byte, off int64) error) error {
	return d.withStager(func(s *stager) error {
		c, i, pending := chunkSize(n), 0, false
		for off := int64(0); off < n; off += c {
			m := min(c, n-off)
			if err := fill(s.buf[i][:m], off); err != nil {
				d.sync(s)
				return err
			}
			if pending {
				if err := d.sync(s); err != nil {
					return err
				}
			}
			if r := d.drv.memcpyHtoDAsync(dst+devptr(off), s.ptr[i], uint64(m), s.stream); r != success {
				d.sync(s)
				return check(d.drv, "cuMemcpyHtoDAsync_v2", r)
			}
			pending, i = true, i^1
		}
		return d.sync(s)
	})
}

// dtoh copies from device address src into p through the staging buffers.
func (d *Device) dtoh(p []byte, src devptr) error {
	return d.dtohFunc(src, int64(len(p)), func(stage []byte, off int64) error {
		copy(p[off:], stage)
		return nil
	})
}

// dtohTo copies n bytes at device address src into another backend's buffer,
// writing them straight from the staging buffers.
func (d *Device) dtohTo(dst gpu.Buffer, dstOff int64, src devptr, n int64) error {
	return d.dtohFunc(src, n, func(stage []byte, off int64) error {
		_, err := dst.WriteAt(stage, dstOff+off)
		return err
	})
}

// dtohFunc copies n bytes at device address src out chunk by chunk: the DMA
// of chunk k+1 is issued before drain takes chunk k out of its staging
// buffer, which the DMA of chunk k-1 used and nothing in flight does.
func (d *Device) dtohFunc(src devptr, n int64, drain func(stage []byte, off int64) error) error {
	return d.withStager(func(s *stager) error {
		c := chunkSize(n)
		issue := func(off int64, i int) error {
			m := min(c, n-off)
			if r := d.drv.memcpyDtoHAsync(s.ptr[i], src+devptr(off), uint64(m), s.stream); r != success {
				d.sync(s)
				return check(d.drv, "cuMemcpyDtoHAsync_v2", r)
			}
			return nil
		}
		if err := issue(0, 0); err != nil {
			return err
		}
		for off, i := int64(0), 0; off < n; off, i = off+c, i^1 {
			if err := d.sync(s); err != nil {
				return err
			}
			if off+c < n {
				if err := issue(off+c, i^1); err != nil {
					return err
				}
			}
			if err := drain(s.buf[i][:min(c, n-off)], off); err != nil {
				d.sync(s)
				return err
			}
		}
		return nil
	})
}

// zero sets n bytes at dst to 0 and waits: cuMemsetD8 on device memory is
// asynchronous to the host, and a write right after (or an importer) must
// not see it land late.
func (d *Device) zero(dst devptr, n int64) error {
	return d.withStager(func(s *stager) error {
		if r := d.drv.memsetD8Async(dst, 0, uint64(n), s.stream); r != success {
			d.sync(s)
			return check(d.drv, "cuMemsetD8Async", r)
		}
		return d.sync(s)
	})
}

// dtod copies n bytes within the device and waits (a device-to-device copy
// is asynchronous to the host too).
func (d *Device) dtod(dst, src devptr, n int64) error {
	return d.withStager(func(s *stager) error {
		if r := d.drv.memcpyDtoDAsync(dst, src, uint64(n), s.stream); r != success {
			d.sync(s)
			return check(d.drv, "cuMemcpyDtoDAsync_v2", r)
		}
		return d.sync(s)
	})
}

// peer copies n bytes from another GPU's memory into this one's and waits.
// Peer access is enabled the first time, when the hardware allows it (NVLink
// or PCIe P2P); without it cuMemcpyPeer still works, staged by the driver.
func (d *Device) peer(dst devptr, from *Device, src devptr, n int64) error {
	if err := d.enablePeer(from); err != nil {
		return err
	}
	return d.withStager(func(s *stager) error {
		if r := d.drv.memcpyPeerAsync(dst, d.ctx, src, from.ctx, uint64(n), s.stream); r != success {
			d.sync(s)
			return check(d.drv, "cuMemcpyPeerAsync", r)
		}
		return d.sync(s)
	})
}

// enablePeer lets this device's context access from's memory, once per pair;
// a refusal is remembered and returned to every later copy on that pair.
func (d *Device) enablePeer(from *Device) error {
	d.pmu.Lock()
	defer d.pmu.Unlock()
	if err, done := d.peers[from]; done {
		return err
	}
	can, r := d.drv.deviceCanAccessPeer(d.dev, from.dev)
	err := check(d.drv, "cuDeviceCanAccessPeer", r)
	if err == nil && can {
		err = d.withCtx(func() error {
			r := d.drv.ctxEnablePeerAccess(from.ctx)
			if r == errPeerAccessEnabled {
				r = success // another user of the primary context enabled it
			}
			return check(d.drv, "cuCtxEnablePeerAccess", r)
		})
	}
	if err != nil {
		err = fmt.Errorf("%s: peer access to %s: %w", d.name, from.name, err)
	}
	d.peers[from] = err
	return err
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
