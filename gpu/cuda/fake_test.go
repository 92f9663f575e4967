package cuda

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"sort"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fakeDriver is a CUDA driver in Go: device memory is Go slices, streams are
// queues run at cuStreamSynchronize (so a staging buffer reused before its
// DMA ran shows up as wrong bytes), and every call checks that the calling OS
// thread has a context current, the way the real driver would act on it.
type fakeDriver struct {
	mu sync.Mutex

	ndev     int
	devTotal uint64 // bytes of memory of each fake GPU
	others   uint64 // bytes of each GPU that other processes hold
	canPeer  bool

	allocs   map[devptr]*fakeAlloc
	nextPtr  devptr
	host     map[unsafe.Pointer][]byte
	streams  map[cuStrm]*fakeStream
	nextStrm cuStrm
	current  map[int]cuCtx // OS thread id -> current context
	retained map[cuDev]int
	peerOn   map[[2]cuCtx]int // (ctx, peer ctx) -> cuCtxEnablePeerAccess calls

	modules  map[cuMod]cuCtx  // loaded modules -> the context they were loaded in
	funcs    map[cuFunc]cuMod // functions found in them
	nextMod  uintptr
	launches []int // descriptors of each scatter launch, in launch order

	fail       map[string]result // op -> result every call returns until cleared
	calls      map[string]int
	violations []string
}

type fakeAlloc struct {
	dev  cuDev
	data []byte
	// foreign: allocated by "another process" (foreignAlloc), so that
	// cuIpcOpenMemHandle opens it; mapOf: a mapping made by
	// cuIpcOpenMemHandle of the allocation at that address, sharing its
	// bytes, in the context of dev.
	foreign bool
	mapOf   devptr
}

type fakeStream struct {
	ctx   cuCtx
	queue []func()
}

func newFake(ndev int, total uint64) *fakeDriver {
	return &fakeDriver{
		ndev: ndev, devTotal: total, canPeer: true,
		allocs: map[devptr]*fakeAlloc{}, nextPtr: 0x7f0000000000,
		host: map[unsafe.Pointer][]byte{}, streams: map[cuStrm]*fakeStream{}, nextStrm: 1,
		current: map[int]cuCtx{}, retained: map[cuDev]int{}, peerOn: map[[2]cuCtx]int{},
		fail: map[string]result{}, calls: map[string]int{},
		modules: map[cuMod]cuCtx{}, funcs: map[cuFunc]cuMod{}, nextMod: 0x5000,
	}
}

func fakeCtx(d cuDev) cuCtx { return cuCtx(0x1000 + int(d)) }

func ctxDev(c cuCtx) cuDev { return cuDev(int(c) - 0x1000) }

// enter counts the call and returns an injected failure, if any. f.mu is held.
func (f *fakeDriver) enter(op string) result {
	f.calls[op]++
	return f.fail[op]
}

// cur is the calling thread's context; a call without one is a violation
// (the real driver would fail it, or act on another device). f.mu is held.
func (f *fakeDriver) cur(op string) (cuCtx, bool) {
	c := f.current[unix.Gettid()]
	if c == 0 {
		f.violations = append(f.violations, op+" with no current context")
		return 0, false
	}
	return c, true
}

// slice finds the device bytes [p, p+n). f.mu is held.
func (f *fakeDriver) slice(p devptr, n uint64) []byte {
	for base, a := range f.allocs {
		if p >= base && uint64(p-base)+n <= uint64(len(a.data)) {
			return a.data[p-base : uint64(p-base)+n]
		}
	}
	return nil
}

func (f *fakeDriver) usedOn(d cuDev) uint64 {
	var u uint64
	for _, a := range f.allocs {
		if a.dev == d && a.mapOf == 0 {
			u += uint64(len(a.data))
		}
	}
	return u
}

func (f *fakeDriver) init() result {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.enter("cuInit")
}

func (f *fakeDriver) deviceGetCount() (int, result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ndev, f.enter("cuDeviceGetCount")
}

func (f *fakeDriver) deviceGet(i int) (cuDev, result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.enter("cuDeviceGet"); r != success {
		return 0, r
	}
	if i < 0 || i >= f.ndev {
		return 0, errInvalidDevice
	}
	return cuDev(i), success
}

func (f *fakeDriver) primaryCtxRetain(d cuDev) (cuCtx, result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.enter("cuDevicePrimaryCtxRetain"); r != success {
		return 0, r
	}
	f.retained[d]++
	return fakeCtx(d), success
}

func (f *fakeDriver) primaryCtxRelease(d cuDev) result {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.retained[d]--
	if f.retained[d] == 0 {
		// The real driver destroys the context: its memory goes with it.
		delete(f.retained, d)
		for p, a := range f.allocs {
			if a.dev == d && !a.foreign {
				delete(f.allocs, p)
			}
		}
	}
	return f.enter("cuDevicePrimaryCtxRelease_v2")
}

func (f *fakeDriver) ctxSetCurrent(c cuCtx) result {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.enter("cuCtxSetCurrent"); r != success {
		return r
	}
	f.current[unix.Gettid()] = c
	return success
}

func (f *fakeDriver) memGetInfo() (uint64, uint64, result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.cur("cuMemGetInfo_v2")
	if !ok {
		return 0, 0, 201
	}
	return f.devTotal - f.usedOn(ctxDev(c)), f.devTotal, f.enter("cuMemGetInfo_v2")
}

func (f *fakeDriver) memAlloc(n uint64) (devptr, result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.enter("cuMemAlloc_v2"); r != success {
		return 0, r
	}
	c, ok := f.cur("cuMemAlloc_v2")
	if !ok {
		return 0, 201
	}
	if f.usedOn(ctxDev(c))+f.others+n > f.devTotal {
		return 0, errOutOfMemory
	}
	p := f.nextPtr
	f.nextPtr += devptr(roundUp(int64(n), ArenaSize))
	data := bytes.Repeat([]byte{0xA5}, int(n)) // cuMemAlloc does not zero
	f.allocs[p] = &fakeAlloc{dev: ctxDev(c), data: data}
	return p, success
}

func (f *fakeDriver) memFree(p devptr) result {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.enter("cuMemFree_v2"); r != success {
		return r
	}
	if _, ok := f.cur("cuMemFree_v2"); !ok {
		return 201
	}
	if f.allocs[p] == nil || f.allocs[p].foreign || f.allocs[p].mapOf != 0 {
		f.violations = append(f.violations, fmt.Sprintf("cuMemFree_v2 of %#x, not allocated by this process", p))
		return 1
	}
	delete(f.allocs, p)
	return success
}

func (f *fakeDriver) ipcGetMemHandle(p devptr) (ipcHndl, result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var h ipcHndl
	if r := f.enter("cuIpcGetMemHandle"); r != success {
		return h, r
	}
	if _, ok := f.cur("cuIpcGetMemHandle"); !ok {
		return h, 201
	}
	if f.allocs[p] == nil {
		return h, 1
	}
	for i := range h {
		h[i] = byte(uint64(p) >> (8 * (i % 8)))
	}
	h[63] = 0xCD
	return h, success
}

// ipcOpenMemHandle decodes the address ipcGetMemHandle put in the handle
// and maps that allocation into the current context, as a new address
// sharing its bytes. Like the real driver it refuses handles of this
// process's own allocations (CUDA_ERROR_INVALID_CONTEXT), and a second open
// of one handle in one context is a violation (the backend shares one).
func (f *fakeDriver) ipcOpenMemHandle(h ipcHndl) (devptr, result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.enter("cuIpcOpenMemHandle_v2"); r != success {
		return 0, r
	}
	c, ok := f.cur("cuIpcOpenMemHandle_v2")
	if !ok {
		return 0, 201
	}
	var p devptr
	for i := range 8 {
		p |= devptr(h[i]) << (8 * i)
	}
	a := f.allocs[p]
	if h[63] != 0xCD || a == nil || a.mapOf != 0 {
		return 0, 1 // CUDA_ERROR_INVALID_VALUE: no such exported memory
	}
	if !a.foreign {
		return 0, errInvalidContext
	}
	for _, m := range f.allocs {
		if m.mapOf == p && m.dev == ctxDev(c) {
			f.violations = append(f.violations, fmt.Sprintf("cuIpcOpenMemHandle_v2 of %#x twice in context %#x", p, c))
		}
	}
	q := f.nextPtr
	f.nextPtr += devptr(roundUp(int64(len(a.data)), ArenaSize))
	f.allocs[q] = &fakeAlloc{dev: ctxDev(c), data: a.data, mapOf: p}
	return q, success
}

func (f *fakeDriver) ipcCloseMemHandle(p devptr) result {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.enter("cuIpcCloseMemHandle"); r != success {
		return r
	}
	c, ok := f.cur("cuIpcCloseMemHandle")
	if !ok {
		return 201
	}
	a := f.allocs[p]
	if a == nil || a.mapOf == 0 || a.dev != ctxDev(c) {
		f.violations = append(f.violations, fmt.Sprintf("cuIpcCloseMemHandle of %#x, not a mapping of context %#x", p, c))
		return 1
	}
	delete(f.allocs, p)
	return success
}

func (f *fakeDriver) memGetAddressRange(p devptr) (devptr, uint64, result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.enter("cuMemGetAddressRange_v2"); r != success {
		return 0, 0, r
	}
	if _, ok := f.cur("cuMemGetAddressRange_v2"); !ok {
		return 0, 0, 201
	}
	for base, a := range f.allocs {
		if p >= base && uint64(p-base) < uint64(len(a.data)) {
			return base, uint64(len(a.data)), success
		}
	}
	return 0, 0, 1
}

// foreignAlloc makes n bytes of device memory on d as another process
// would (filled with fill), and returns its IPC handle and address.
func (f *fakeDriver) foreignAlloc(d cuDev, n int, fill []byte) (string, devptr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.nextPtr
	f.nextPtr += devptr(roundUp(int64(n), ArenaSize))
	data := make([]byte, n)
	copy(data, fill)
	f.allocs[p] = &fakeAlloc{dev: d, data: data, foreign: true}
	var h ipcHndl
	for i := range h {
		h[i] = byte(uint64(p) >> (8 * (i % 8)))
	}
	h[63] = 0xCD
	return "cuda:" + hex.EncodeToString(h[:]), p
}

// freeForeign frees what foreignAlloc made.
func (f *fakeDriver) freeForeign(p devptr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.allocs, p)
}

// mappings counts the live cuIpcOpenMemHandle mappings.
func (f *fakeDriver) mappings() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, a := range f.allocs {
		if a.mapOf != 0 {
			n++
		}
	}
	return n
}

func (f *fakeDriver) memHostAlloc(n uint64) (unsafe.Pointer, result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.enter("cuMemHostAlloc"); r != success {
		return nil, r
	}
	if _, ok := f.cur("cuMemHostAlloc"); !ok {
		return nil, 201
	}
	b := make([]byte, n)
	p := unsafe.Pointer(&b[0])
	f.host[p] = b
	return p, success
}

func (f *fakeDriver) memFreeHost(p unsafe.Pointer) result {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.host[p] == nil {
		f.violations = append(f.violations, "cuMemFreeHost of unknown memory")
		return 1
	}
	delete(f.host, p)
	return f.enter("cuMemFreeHost")
}

// hostSlice finds the page-locked bytes [p, p+n). f.mu is held.
func (f *fakeDriver) hostSlice(p unsafe.Pointer, n uint64) []byte { return f.hostAt(uintptr(p), n) }

// hostAt is hostSlice of an address a kernel reads: page-locked memory is
// at the same address in every context (unified addressing).
func (f *fakeDriver) hostAt(p uintptr, n uint64) []byte {
	for base, b := range f.host {
		if off := p - uintptr(base); p >= uintptr(base) && uint64(off)+n <= uint64(len(b)) {
			return b[off : uint64(off)+n]
		}
	}
	return nil
}

// kernelBytes is the n bytes at p that a kernel reads: device memory, or
// page-locked host memory. f.mu is held.
func (f *fakeDriver) kernelBytes(p uint64, n uint64) []byte {
	if b := f.slice(devptr(p), n); b != nil {
		return b
	}
	return f.hostAt(uintptr(p), n)
}

func (f *fakeDriver) streamCreate() (cuStrm, result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.enter("cuStreamCreate"); r != success {
		return 0, r
	}
	c, ok := f.cur("cuStreamCreate")
	if !ok {
		return 0, 201
	}
	s := f.nextStrm
	f.nextStrm++
	f.streams[s] = &fakeStream{ctx: c}
	return s, success
}

func (f *fakeDriver) streamDestroy(s cuStrm) result {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st := f.streams[s]; st == nil || len(st.queue) > 0 {
		f.violations = append(f.violations, "cuStreamDestroy_v2 of an unknown or busy stream")
	}
	delete(f.streams, s)
	return f.enter("cuStreamDestroy_v2")
}

// stream checks that s belongs to the current context. f.mu is held.
func (f *fakeDriver) stream(op string, s cuStrm) *fakeStream {
	c, ok := f.cur(op)
	st := f.streams[s]
	if !ok || st == nil || st.ctx != c {
		f.violations = append(f.violations, fmt.Sprintf("%s on stream %d from context %#x", op, s, c))
		return nil
	}
	return st
}

func (f *fakeDriver) streamSynchronize(s cuStrm) result {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.stream("cuStreamSynchronize", s)
	if st == nil {
		return 400
	}
	for _, op := range st.queue {
		op()
	}
	st.queue = nil
	return f.enter("cuStreamSynchronize")
}

// enqueue adds a copy to s, run at the next synchronization. f.mu is held.
func (f *fakeDriver) enqueue(op string, s cuStrm, dst, src func() []byte) result {
	if r := f.enter(op); r != success {
		return r
	}
	st := f.stream(op, s)
	if st == nil {
		return 400
	}
	if dst() == nil || src() == nil {
		f.violations = append(f.violations, op+" outside any allocation")
		return 1
	}
	st.queue = append(st.queue, func() { copy(dst(), src()) })
	return success
}

func (f *fakeDriver) memcpyHtoDAsync(dst devptr, src unsafe.Pointer, n uint64, s cuStrm) result {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.enqueue("cuMemcpyHtoDAsync_v2", s, func() []byte { return f.slice(dst, n) }, func() []byte { return f.hostSlice(src, n) })
}

func (f *fakeDriver) memcpyDtoHAsync(dst unsafe.Pointer, src devptr, n uint64, s cuStrm) result {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.enqueue("cuMemcpyDtoHAsync_v2", s, func() []byte { return f.hostSlice(dst, n) }, func() []byte { return f.slice(src, n) })
}

func (f *fakeDriver) memcpyDtoDAsync(dst, src devptr, n uint64, s cuStrm) result {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.enqueue("cuMemcpyDtoDAsync_v2", s, func() []byte { return f.slice(dst, n) }, func() []byte { return f.slice(src, n) })
}

func (f *fakeDriver) memcpyPeerAsync(dst devptr, dstCtx cuCtx, src devptr, srcCtx cuCtx, n uint64, s cuStrm) result {
	f.mu.Lock()
	defer f.mu.Unlock()
	if a := f.allocOf(dst); a == nil || fakeCtx(a.dev) != dstCtx {
		f.violations = append(f.violations, "cuMemcpyPeerAsync: dst not in dstContext")
	}
	if a := f.allocOf(src); a == nil || fakeCtx(a.dev) != srcCtx {
		f.violations = append(f.violations, "cuMemcpyPeerAsync: src not in srcContext")
	}
	return f.enqueue("cuMemcpyPeerAsync", s, func() []byte { return f.slice(dst, n) }, func() []byte { return f.slice(src, n) })
}

func (f *fakeDriver) allocOf(p devptr) *fakeAlloc {
	for base, a := range f.allocs {
		if p >= base && uint64(p-base) < uint64(len(a.data)) {
			return a
		}
	}
	return nil
}

func (f *fakeDriver) memsetD8Async(dst devptr, v byte, n uint64, s cuStrm) result {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.enter("cuMemsetD8Async"); r != success {
		return r
	}
	st := f.stream("cuMemsetD8Async", s)
	if st == nil {
		return 400
	}
	if f.slice(dst, n) == nil {
		f.violations = append(f.violations, "cuMemsetD8Async outside any allocation")
		return 1
	}
	st.queue = append(st.queue, func() {
		b := f.slice(dst, n)
		clear(b)
		if v != 0 {
			copy(b, bytes.Repeat([]byte{v}, len(b)))
		}
	})
	return success
}

func (f *fakeDriver) deviceCanAccessPeer(d, peer cuDev) (bool, result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.canPeer && d != peer, f.enter("cuDeviceCanAccessPeer")
}

func (f *fakeDriver) ctxEnablePeerAccess(peer cuCtx) result {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.enter("cuCtxEnablePeerAccess"); r != success {
		return r
	}
	c, ok := f.cur("cuCtxEnablePeerAccess")
	if !ok {
		return 201
	}
	k := [2]cuCtx{c, peer}
	f.peerOn[k]++
	if f.peerOn[k] > 1 {
		return errPeerAccessEnabled
	}
	return success
}

// moduleLoadData accepts any NUL-terminated image that names the scatter
// kernel (the PTX is not compiled: the fake "kernel" is Go, in launchKernel).
func (f *fakeDriver) moduleLoadData(image []byte) (cuMod, result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.enter("cuModuleLoadData"); r != success {
		return 0, r
	}
	c, ok := f.cur("cuModuleLoadData")
	if !ok {
		return 0, 201
	}
	if len(image) == 0 || image[len(image)-1] != 0 {
		f.violations = append(f.violations, "cuModuleLoadData of an image without its NUL")
		return 0, 200 // CUDA_ERROR_INVALID_IMAGE
	}
	f.nextMod++
	m := cuMod(f.nextMod)
	f.modules[m] = c
	return m, success
}

func (f *fakeDriver) moduleUnload(m cuMod) result {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.cur("cuModuleUnload")
	if !ok {
		return 201
	}
	if f.modules[m] != c {
		f.violations = append(f.violations, fmt.Sprintf("cuModuleUnload of module %#x, not loaded in context %#x", m, c))
		return 400
	}
	delete(f.modules, m)
	for fn, fm := range f.funcs {
		if fm == m {
			delete(f.funcs, fn)
		}
	}
	return f.enter("cuModuleUnload")
}

func (f *fakeDriver) moduleGetFunction(m cuMod, name string) (cuFunc, result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.enter("cuModuleGetFunction"); r != success {
		return 0, r
	}
	if _, ok := f.modules[m]; !ok {
		return 0, 400
	}
	if name != scatterName {
		return 0, 500 // CUDA_ERROR_NOT_FOUND
	}
	f.nextMod++
	fn := cuFunc(f.nextMod)
	f.funcs[fn] = m
	return fn, success
}

// hostWord reads the 8 bytes at address p of page-locked memory; ok is
// false when they are not inside one. f.mu is held.
func (f *fakeDriver) hostWord(p uintptr) (uint64, bool) {
	for base, b := range f.host {
		if off := p - uintptr(base); p >= uintptr(base) && off+8 <= uintptr(len(b)) {
			return binary.LittleEndian.Uint64(b[off:]), true
		}
	}
	return 0, false
}

// readable reports whether a kernel running in context c may address
// device memory at p: memory of c's device (its own allocations, or IPC
// mappings made in c), or of a peer whose access c enabled; never another
// process's memory except through a mapping. f.mu is held.
func (f *fakeDriver) readable(c cuCtx, p devptr, n uint64) bool {
	a := f.allocOf(p)
	if a == nil || a.foreign || f.slice(p, n) == nil {
		return false
	}
	return a.dev == ctxDev(c) || f.peerOn[[2]cuCtx{c, fakeCtx(a.dev)}] > 0
}

// launchKernel runs the scatter kernel in Go at the stream's next
// synchronization, the way the GPU would run it after what was enqueued
// before: it reads its arguments (descs, count) through params now, as the
// driver does, and the descriptors (in device memory, or page-locked host
// memory) when it runs.
func (f *fakeDriver) launchKernel(fn cuFunc, grid, block [3]uint32, shmem uint32, s cuStrm, params unsafe.Pointer) result {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.enter("cuLaunchKernel"); r != success {
		return r
	}
	st := f.stream("cuLaunchKernel", s)
	if st == nil {
		return 400
	}
	m, ok := f.funcs[fn]
	if !ok || f.modules[m] != st.ctx {
		f.violations = append(f.violations, "cuLaunchKernel of a function not loaded in the stream's context")
		return 400
	}
	if grid[0] == 0 || grid[1] != 1 || grid[2] != 1 || block != [3]uint32{batchBlock, 1, 1} || shmem != 0 {
		f.violations = append(f.violations, fmt.Sprintf("cuLaunchKernel with grid %v block %v shmem %d", grid, block, shmem))
		return 1
	}
	pa, ok1 := f.hostWord(uintptr(params))
	pn, ok2 := f.hostWord(uintptr(params) + 8)
	var descs, count uint64
	var ok3, ok4 bool
	if ok1 && ok2 {
		descs, ok3 = f.hostWord(uintptr(pa))
		count, ok4 = f.hostWord(uintptr(pn))
	}
	if !ok3 || !ok4 {
		f.violations = append(f.violations, "cuLaunchKernel: kernelParams not in page-locked memory")
		return 1
	}
	if uint64(grid[0]) != count || f.kernelBytes(descs, count*descSize) == nil {
		f.violations = append(f.violations, fmt.Sprintf("cuLaunchKernel: %d blocks for %d descriptors at %#x", grid[0], count, descs))
		return 1
	}
	f.launches = append(f.launches, int(count))
	ctx := st.ctx
	st.queue = append(st.queue, func() {
		arr := f.kernelBytes(descs, count*descSize) // read as the kernel runs
		for i := range count {
			e := arr[i*descSize:]
			dst, src, n := devptr(binary.LittleEndian.Uint64(e)), devptr(binary.LittleEndian.Uint64(e[8:])), binary.LittleEndian.Uint64(e[16:])
			if !f.readable(ctx, dst, n) || !f.readable(ctx, src, n) {
				f.violations = append(f.violations, fmt.Sprintf("scatter kernel: descriptor %d {%#x, %#x, %d} outside the context's memory", i, dst, src, n))
				continue
			}
			copy(f.slice(dst, n), f.slice(src, n))
		}
	})
	return success
}

// launched returns the descriptor counts of the scatter launches so far.
func (f *fakeDriver) launched() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.launches...)
}

// errorName knows a few codes, as an old driver would, so that the table
// fallback is exercised too.
func (f *fakeDriver) errorName(r result) string {
	switch r {
	case errOutOfMemory:
		return "CUDA_ERROR_OUT_OF_MEMORY"
	case 999:
		return "CUDA_ERROR_UNKNOWN"
	}
	return ""
}

// setFail makes every call of op return r (success clears it).
func (f *fakeDriver) setFail(op string, r result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r == success {
		delete(f.fail, op)
	} else {
		f.fail[op] = r
	}
}

// state is a snapshot for assertions.
type fakeState struct {
	allocs     []int // sizes of live device allocations, sorted
	host       int   // live page-locked buffers
	streams    int
	modules    int
	retained   int
	violations []string
}

func (f *fakeDriver) state() fakeState {
	f.mu.Lock()
	defer f.mu.Unlock()
	var s fakeState
	for _, a := range f.allocs {
		s.allocs = append(s.allocs, len(a.data))
	}
	sort.Ints(s.allocs)
	s.host, s.streams, s.modules = len(f.host), len(f.streams), len(f.modules)
	for _, n := range f.retained {
		s.retained += n
	}
	s.violations = append(s.violations, f.violations...)
	return s
}

// peek returns a copy of device bytes, for checking what a buffer holds
// without going through the code under test.
func (f *fakeDriver) peek(p devptr, n int64) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]byte(nil), f.slice(p, uint64(n))...)
}

// fakeLib is a library whose symbols are made-up addresses.
type fakeLib struct {
	openErr error
	missing string // a symbol it lacks
	looked  []string
	closed  bool
}

func (l *fakeLib) open() error { return l.openErr }

func (l *fakeLib) lookup(name string) (uintptr, error) {
	l.looked = append(l.looked, name)
	if name == l.missing {
		return 0, fmt.Errorf("undefined symbol: %s", name)
	}
	return uintptr(0x1000 + len(l.looked)), nil
}

func (l *fakeLib) close() error { l.closed = true; return nil }
