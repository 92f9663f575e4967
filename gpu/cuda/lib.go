package cuda

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/tensorfs/tensorfs/gpu"
)

// LibraryName is the CUDA driver library loaded at run time.
const LibraryName = "libcuda.so.1"

// library is a dynamic library: open it, look up symbols, close it. The real
// one is dlopen through purego; tests use a fake to check symbol resolution
// and the missing-library path.
type library interface {
	open() error
	lookup(name string) (uintptr, error)
	close() error
}

// dlLibrary is a library loaded with dlopen.
type dlLibrary struct {
	name   string
	handle uintptr
}

func (l *dlLibrary) open() error {
	h, err := purego.Dlopen(l.name, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return err
	}
	l.handle = h
	return nil
}

func (l *dlLibrary) lookup(name string) (uintptr, error) { return purego.Dlsym(l.handle, name) }

func (l *dlLibrary) close() error { return purego.Dlclose(l.handle) }

// symbols are the driver's entry points, resolved once, at load (table names
// each one's C symbol).
type symbols struct {
	getErrorName        uintptr
	init                uintptr
	deviceGetCount      uintptr
	deviceGet           uintptr
	primaryCtxRetain    uintptr
	primaryCtxRelease   uintptr
	ctxSetCurrent       uintptr
	memGetInfo          uintptr
	memAlloc            uintptr
	memFree             uintptr
	ipcGetMemHandle     uintptr
	ipcOpenMemHandle    uintptr
	ipcCloseMemHandle   uintptr
	memGetAddressRange  uintptr
	memHostAlloc        uintptr
	memFreeHost         uintptr
	streamCreate        uintptr
	streamDestroy       uintptr
	streamSynchronize   uintptr
	memcpyHtoDAsync     uintptr
	memcpyDtoHAsync     uintptr
	memcpyDtoDAsync     uintptr
	memcpyPeerAsync     uintptr
	memsetD8Async       uintptr
	deviceCanAccessPeer uintptr
	ctxEnablePeerAccess uintptr
	moduleLoadData      uintptr
	moduleUnload        uintptr
	moduleGetFunction   uintptr
	launchKernel        uintptr
}

// table names the C symbol of every entry point. Where cuda.h maps a name to
// a _v2 symbol (64-bit sizes and CUdeviceptr) the _v2 one is named: the
// plain symbol of those is the old 32-bit ABI, and calling it would truncate.
func (s *symbols) table() []struct {
	name string
	ptr  *uintptr
} {
	return []struct {
		name string
		ptr  *uintptr
	}{
		{"cuGetErrorName", &s.getErrorName},
		{"cuInit", &s.init},
		{"cuDeviceGetCount", &s.deviceGetCount},
		{"cuDeviceGet", &s.deviceGet},
		{"cuDevicePrimaryCtxRetain", &s.primaryCtxRetain},
		{"cuDevicePrimaryCtxRelease_v2", &s.primaryCtxRelease},
		{"cuCtxSetCurrent", &s.ctxSetCurrent},
		{"cuMemGetInfo_v2", &s.memGetInfo},
		{"cuMemAlloc_v2", &s.memAlloc},
		{"cuMemFree_v2", &s.memFree},
		{"cuIpcGetMemHandle", &s.ipcGetMemHandle},
		{"cuIpcOpenMemHandle_v2", &s.ipcOpenMemHandle},
		{"cuIpcCloseMemHandle", &s.ipcCloseMemHandle},
		{"cuMemGetAddressRange_v2", &s.memGetAddressRange},
		{"cuMemHostAlloc", &s.memHostAlloc},
		{"cuMemFreeHost", &s.memFreeHost},
		{"cuStreamCreate", &s.streamCreate},
		{"cuStreamDestroy_v2", &s.streamDestroy},
		{"cuStreamSynchronize", &s.streamSynchronize},
		{"cuMemcpyHtoDAsync_v2", &s.memcpyHtoDAsync},
		{"cuMemcpyDtoHAsync_v2", &s.memcpyDtoHAsync},
		{"cuMemcpyDtoDAsync_v2", &s.memcpyDtoDAsync},
		{"cuMemcpyPeerAsync", &s.memcpyPeerAsync},
		{"cuMemsetD8Async", &s.memsetD8Async},
		{"cuDeviceCanAccessPeer", &s.deviceCanAccessPeer},
		{"cuCtxEnablePeerAccess", &s.ctxEnablePeerAccess},
		{"cuModuleLoadData", &s.moduleLoadData},
		{"cuModuleUnload", &s.moduleUnload},
		{"cuModuleGetFunction", &s.moduleGetFunction},
		{"cuLaunchKernel", &s.launchKernel},
	}
}

// loaded is the process's one driver: libcuda is loaded at the first Open
// and never unloaded, because dlclose of a library that cuInit has started
// (its threads, its atexit handlers) crashes processes; the failure of a
// load is not kept, so a later Open tries again.
var loaded struct {
	sync.Mutex
	drv *libDriver
}

// loadDriver returns the process's driver, loading libcuda.so.1 at the first
// call. Errors: gpu.ErrNoDriver (wrapped, naming the library) when it is
// missing or lacks an entry point.
func loadDriver() (*libDriver, error) {
	loaded.Lock()
	defer loaded.Unlock()
	if loaded.drv != nil {
		return loaded.drv, nil
	}
	drv, err := bind(&dlLibrary{name: LibraryName}, LibraryName)
	if err != nil {
		return nil, err
	}
	loaded.drv = drv
	return drv, nil
}

// bind opens lib and resolves every symbol. A library that lacks one is
// closed again (nothing of it has run yet) and reported as no driver: a
// driver too old for this backend is as good as none.
func bind(lib library, name string) (*libDriver, error) {
	if err := lib.open(); err != nil {
		msg := err.Error() // dlerror's text names the file, usually
		if !strings.Contains(msg, name) {
			msg = name + ": " + msg
		}
		return nil, fmt.Errorf("%s: %w", msg, gpu.ErrNoDriver)
	}
	d := &libDriver{}
	for _, s := range d.sym.table() {
		p, err := lib.lookup(s.name)
		if err == nil && p == 0 {
			err = fmt.Errorf("symbol is NULL")
		}
		if err != nil {
			lib.close()
			return nil, fmt.Errorf("%s: no %s (driver too old?): %v: %w", name, s.name, err, gpu.ErrNoDriver)
		}
		*s.ptr = p
	}
	// The one entry point with a struct argument goes through purego's
	// RegisterFunc, which lays the struct out by the platform's C ABI.
	purego.RegisterFunc(&d.ipcOpen, d.sym.ipcOpenMemHandle)
	return d, nil
}

// libDriver is the real driver: each method is one purego call of the C
// function resolved at load, through call, which is go:uintptrescapes
// (as purego.SyscallN is): a Go pointer converted in its argument list
// stays valid for the call.
type libDriver struct {
	sym symbols
	// ipcOpen is cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle
	// handle, unsigned int flags), bound with purego.RegisterFunc: the
	// handle is a 64-byte struct passed by value, which SyscallN (integer
	// words only) cannot express portably. On linux/amd64 (System V) a
	// struct over 16 bytes is passed in memory, copied into the stack
	// argument area, while pdptr and flags take the first two integer
	// registers; on arm64 (AAPCS64) a struct over 16 bytes is passed as a
	// pointer to a caller-made copy. purego v0.11.3 implements both
	// (placeStack in struct_amd64.go, struct_arm64.go) for C calls.
	ipcOpen func(pdptr *uint64, h cuIpcMemHandle, flags uint32) int32
}

// cuIpcMemHandle is CUipcMemHandle as cuda.h declares it: struct {
// char reserved[CU_IPC_HANDLE_SIZE]; } with CU_IPC_HANDLE_SIZE 64. A Go
// struct (not a bare array) so that purego passes it as a C struct.
type cuIpcMemHandle struct{ Reserved [64]byte }

// call invokes fn and returns its CUresult; a C enum comes back in the low 32
// bits of the return register, the upper ones are undefined.
//
// go:uintptrescapes: a Go pointer converted to uintptr in call's argument
// list (an out parameter, &p) is moved to the heap and kept alive for the
// call, as for purego.SyscallN's own. Without it the conversion sat in
// the list of this wrapper, not of SyscallN: p stayed on the goroutine's
// stack, and when that stack grew on the way into the C call it moved,
// and the driver wrote its result into the old stack. cuMemAlloc_v2 then
// "succeeded" with pointer 0 (the daemon's next cuIpcGetMemHandle failed
// with CUDA_ERROR_INVALID_VALUE on an H100 host, 2026-12-06/07), and the
// write landed in freed stack memory.
//
//go:uintptrescapes
func call(fn uintptr, args ...uintptr) result {
	r, _, _ := purego.SyscallN(fn, args...)
	return result(int32(uint32(r)))
}

func (d *libDriver) init() result { return call(d.sym.init, 0) }

func (d *libDriver) deviceGetCount() (int, result) {
	var n int32
	r := call(d.sym.deviceGetCount, uintptr(unsafe.Pointer(&n)))
	return int(n), r
}

func (d *libDriver) deviceGet(ordinal int) (cuDev, result) {
	var dev int32
	r := call(d.sym.deviceGet, uintptr(unsafe.Pointer(&dev)), uintptr(ordinal))
	return cuDev(dev), r
}

func (d *libDriver) primaryCtxRetain(dev cuDev) (cuCtx, result) {
	var c uintptr
	r := call(d.sym.primaryCtxRetain, uintptr(unsafe.Pointer(&c)), uintptr(dev))
	return cuCtx(c), r
}

func (d *libDriver) primaryCtxRelease(dev cuDev) result {
	return call(d.sym.primaryCtxRelease, uintptr(dev))
}

func (d *libDriver) ctxSetCurrent(c cuCtx) result { return call(d.sym.ctxSetCurrent, uintptr(c)) }

func (d *libDriver) memGetInfo() (free, total uint64, r result) {
	r = call(d.sym.memGetInfo, uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total)))
	return free, total, r
}

func (d *libDriver) memAlloc(n uint64) (devptr, result) {
	var p uint64
	r := call(d.sym.memAlloc, uintptr(unsafe.Pointer(&p)), uintptr(n))
	return devptr(p), r
}

func (d *libDriver) memFree(p devptr) result { return call(d.sym.memFree, uintptr(p)) }

func (d *libDriver) ipcGetMemHandle(p devptr) (ipcHndl, result) {
	var h ipcHndl
	r := call(d.sym.ipcGetMemHandle, uintptr(unsafe.Pointer(&h)), uintptr(p))
	return h, r
}

// cuIPCMemLazyEnablePeerAccess is CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
// (cuda.h, CUipcMem_flags): when the memory lives on another GPU than the
// importing context's, peer access to it is enabled on demand, so a GPU1
// daemon can import GPU0 memory of another process.
const cuIPCMemLazyEnablePeerAccess = 1

func (d *libDriver) ipcOpenMemHandle(h ipcHndl) (devptr, result) {
	var p uint64
	r := d.ipcOpen(&p, cuIpcMemHandle{Reserved: h}, cuIPCMemLazyEnablePeerAccess)
	return devptr(p), result(r)
}

func (d *libDriver) ipcCloseMemHandle(p devptr) result {
	return call(d.sym.ipcCloseMemHandle, uintptr(p))
}

func (d *libDriver) memGetAddressRange(p devptr) (devptr, uint64, result) {
	var base, size uint64
	r := call(d.sym.memGetAddressRange, uintptr(unsafe.Pointer(&base)), uintptr(unsafe.Pointer(&size)), uintptr(p))
	return devptr(base), size, r
}

// cuMemHostAllocPortable pins the memory for every context, so a stager of
// one device could serve a copy issued in another's.
const cuMemHostAllocPortable = 1

func (d *libDriver) memHostAlloc(n uint64) (unsafe.Pointer, result) {
	var p unsafe.Pointer
	r := call(d.sym.memHostAlloc, uintptr(unsafe.Pointer(&p)), uintptr(n), cuMemHostAllocPortable)
	return p, r
}

func (d *libDriver) memFreeHost(p unsafe.Pointer) result {
	return call(d.sym.memFreeHost, uintptr(p))
}

// cuStreamNonBlocking: the stream does not synchronize with the legacy
// default stream.
const cuStreamNonBlocking = 1

func (d *libDriver) streamCreate() (cuStrm, result) {
	var s uintptr
	r := call(d.sym.streamCreate, uintptr(unsafe.Pointer(&s)), cuStreamNonBlocking)
	return cuStrm(s), r
}

func (d *libDriver) streamDestroy(s cuStrm) result { return call(d.sym.streamDestroy, uintptr(s)) }

func (d *libDriver) streamSynchronize(s cuStrm) result {
	return call(d.sym.streamSynchronize, uintptr(s))
}

func (d *libDriver) memcpyHtoDAsync(dst devptr, src unsafe.Pointer, n uint64, s cuStrm) result {
	return call(d.sym.memcpyHtoDAsync, uintptr(dst), uintptr(src), uintptr(n), uintptr(s))
}

func (d *libDriver) memcpyDtoHAsync(dst unsafe.Pointer, src devptr, n uint64, s cuStrm) result {
	return call(d.sym.memcpyDtoHAsync, uintptr(dst), uintptr(src), uintptr(n), uintptr(s))
}

func (d *libDriver) memcpyDtoDAsync(dst, src devptr, n uint64, s cuStrm) result {
	return call(d.sym.memcpyDtoDAsync, uintptr(dst), uintptr(src), uintptr(n), uintptr(s))
}

func (d *libDriver) memcpyPeerAsync(dst devptr, dstCtx cuCtx, src devptr, srcCtx cuCtx, n uint64, s cuStrm) result {
	return call(d.sym.memcpyPeerAsync, uintptr(dst), uintptr(dstCtx), uintptr(src), uintptr(srcCtx), uintptr(n), uintptr(s))
}

func (d *libDriver) memsetD8Async(dst devptr, v byte, n uint64, s cuStrm) result {
	return call(d.sym.memsetD8Async, uintptr(dst), uintptr(v), uintptr(n), uintptr(s))
}

func (d *libDriver) deviceCanAccessPeer(dev, peer cuDev) (bool, result) {
	var can int32
	r := call(d.sym.deviceCanAccessPeer, uintptr(unsafe.Pointer(&can)), uintptr(dev), uintptr(peer))
	return can != 0, r
}

func (d *libDriver) ctxEnablePeerAccess(peer cuCtx) result {
	return call(d.sym.ctxEnablePeerAccess, uintptr(peer), 0)
}

// moduleLoadData passes image as it is: the caller NUL-terminates PTX text
// (cuModuleLoadData reads a PTX image up to its NUL). The image is heap
// memory, which the runtime does not move, kept alive across the call
// (call is go:uintptrescapes; the KeepAlive says so where it matters);
// the driver keeps no pointer to it after it returns.
func (d *libDriver) moduleLoadData(image []byte) (cuMod, result) {
	var m uintptr
	r := call(d.sym.moduleLoadData, uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&image[0])))
	runtime.KeepAlive(image) // nothing else refers to it once converted
	return cuMod(m), r
}

func (d *libDriver) moduleUnload(m cuMod) result { return call(d.sym.moduleUnload, uintptr(m)) }

func (d *libDriver) moduleGetFunction(m cuMod, name string) (cuFunc, result) {
	var f uintptr
	cname := append([]byte(name), 0)
	r := call(d.sym.moduleGetFunction, uintptr(unsafe.Pointer(&f)), uintptr(m), uintptr(unsafe.Pointer(&cname[0])))
	runtime.KeepAlive(cname)
	return cuFunc(f), r
}

// launchKernel is cuLaunchKernel(f, gridDimX, gridDimY, gridDimZ,
// blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams,
// extra): eleven integer words, which purego passes in registers and on
// the stack by the C ABI (SyscallN takes up to 15). params points at C
// memory (the stager's page-locked buffer holds the pointer array and the
// values), so nothing the driver reads is Go memory the runtime may move.
func (d *libDriver) launchKernel(fn cuFunc, grid, block [3]uint32, shmem uint32, s cuStrm, params unsafe.Pointer) result {
	return call(d.sym.launchKernel, uintptr(fn),
		uintptr(grid[0]), uintptr(grid[1]), uintptr(grid[2]),
		uintptr(block[0]), uintptr(block[1]), uintptr(block[2]),
		uintptr(shmem), uintptr(s), uintptr(params), 0)
}

// errorName reads the static C string cuGetErrorName points at.
func (d *libDriver) errorName(code result) string {
	var p *byte
	if call(d.sym.getErrorName, uintptr(code), uintptr(unsafe.Pointer(&p))) != success || p == nil {
		return ""
	}
	var b []byte
	for q := unsafe.Pointer(p); *(*byte)(q) != 0 && len(b) < 128; q = unsafe.Add(q, 1) {
		b = append(b, *(*byte)(q))
	}
	return string(b)
}
