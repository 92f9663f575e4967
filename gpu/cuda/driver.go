package cuda

import "unsafe"

// Driver API handle types, as the C API declares them.
type (
	devptr  uint64  // CUdeviceptr: an address in the unified device address space
	cuDev   int32   // CUdevice: an ordinal-like device handle
	cuCtx   uintptr // CUcontext
	cuStrm  uintptr // CUstream
	cuMod   uintptr // CUmodule
	cuFunc  uintptr // CUfunction
	ipcHndl [64]byte
)

// driver is the part of the CUDA driver API the backend uses, one method per
// C function. The real one (libDriver) calls libcuda.so.1 through purego; the
// unit tests use a fake that keeps device memory in Go slices, so the logic
// above it (sub-allocation, staging, accounting, error paths) runs without a
// GPU. Methods mirror the C calls exactly: every call that touches device
// memory or streams needs the device's context current on the calling OS
// thread (see Device.withCtx).
type driver interface {
	init() result
	deviceGetCount() (int, result)
	deviceGet(ordinal int) (cuDev, result)
	primaryCtxRetain(d cuDev) (cuCtx, result)
	primaryCtxRelease(d cuDev) result
	ctxSetCurrent(c cuCtx) result
	memGetInfo() (free, total uint64, r result)
	memAlloc(n uint64) (devptr, result)
	memFree(p devptr) result
	ipcGetMemHandle(p devptr) (ipcHndl, result)
	// ipcOpenMemHandle maps another process's exported allocation into the
	// current context (cuIpcOpenMemHandle_v2 with
	// CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) and returns the mapped pointer,
	// which corresponds to the exporter's pointer.
	ipcOpenMemHandle(h ipcHndl) (devptr, result)
	// ipcCloseMemHandle unmaps what ipcOpenMemHandle mapped; the
	// exporter's memory is not freed.
	ipcCloseMemHandle(p devptr) result
	// memGetAddressRange returns the base and size in bytes of the
	// allocation that contains p (cuMemGetAddressRange_v2).
	memGetAddressRange(p devptr) (base devptr, size uint64, r result)
	// memHostAlloc returns page-locked host memory, usable by any context.
	memHostAlloc(n uint64) (unsafe.Pointer, result)
	memFreeHost(p unsafe.Pointer) result
	// streamCreate makes a non-blocking stream: it does not synchronize
	// with the legacy default stream, so one caller's copy never waits for
	// another's.
	streamCreate() (cuStrm, result)
	streamDestroy(s cuStrm) result
	streamSynchronize(s cuStrm) result
	memcpyHtoDAsync(dst devptr, src unsafe.Pointer, n uint64, s cuStrm) result
	memcpyDtoHAsync(dst unsafe.Pointer, src devptr, n uint64, s cuStrm) result
	memcpyDtoDAsync(dst, src devptr, n uint64, s cuStrm) result
	memcpyPeerAsync(dst devptr, dstCtx cuCtx, src devptr, srcCtx cuCtx, n uint64, s cuStrm) result
	memsetD8Async(dst devptr, v byte, n uint64, s cuStrm) result
	deviceCanAccessPeer(d, peer cuDev) (bool, result)
	// ctxEnablePeerAccess lets the current context access peer's memory.
	ctxEnablePeerAccess(peer cuCtx) result
	// moduleLoadData loads a module image (here: NUL-terminated PTX text,
	// JIT-compiled by the driver for the current context's device) into the
	// current context (cuModuleLoadData).
	moduleLoadData(image []byte) (cuMod, result)
	// moduleUnload unloads a module of the current context (cuModuleUnload).
	moduleUnload(m cuMod) result
	// moduleGetFunction finds the kernel named name (its extern "C" symbol)
	// in m (cuModuleGetFunction).
	moduleGetFunction(m cuMod, name string) (cuFunc, result)
	// launchKernel enqueues fn on s with a grid of grid blocks of block
	// threads each, shmem bytes of dynamic shared memory and params, a
	// void*[] with one pointer to each kernel argument's value, read by
	// the driver before it returns (cuLaunchKernel; extra is NULL).
	launchKernel(fn cuFunc, grid, block [3]uint32, shmem uint32, s cuStrm, params unsafe.Pointer) result
	// errorName is cuGetErrorName's answer, "" when it has none.
	errorName(r result) string
}
