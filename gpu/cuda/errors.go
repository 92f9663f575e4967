package cuda

import (
	"fmt"

	"github.com/tensorfs/tensorfs/gpu"
)

// result is a CUresult, the status every driver API function returns.
type result int32

// CUresult codes the backend acts on; the names of the others come from the
// driver (cuGetErrorName) or, failing that, from errorNames.
const (
	success              result = 0
	errOutOfMemory       result = 2
	errNoDevice          result = 100
	errInvalidDevice     result = 101
	errPeerAccessEnabled result = 704 // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
	errInvalidContext    result = 201 // CUDA_ERROR_INVALID_CONTEXT
)

// errorNames gives driver errors a name when the library cannot (it is not
// loaded, or cuGetErrorName does not know the code), so error strings work in
// tests with a fake driver and in logs of a half-loaded one.
var errorNames = map[result]string{
	0:   "CUDA_SUCCESS",
	1:   "CUDA_ERROR_INVALID_VALUE",
	2:   "CUDA_ERROR_OUT_OF_MEMORY",
	3:   "CUDA_ERROR_NOT_INITIALIZED",
	4:   "CUDA_ERROR_DEINITIALIZED",
	100: "CUDA_ERROR_NO_DEVICE",
	101: "CUDA_ERROR_INVALID_DEVICE",
	201: "CUDA_ERROR_INVALID_CONTEXT",
	200: "CUDA_ERROR_INVALID_IMAGE",
	205: "CUDA_ERROR_MAP_FAILED",
	208: "CUDA_ERROR_ALREADY_MAPPED",
	209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
	217: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
	218: "CUDA_ERROR_INVALID_PTX",
	222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
	400: "CUDA_ERROR_INVALID_HANDLE",
	500: "CUDA_ERROR_NOT_FOUND",
	700: "CUDA_ERROR_ILLEGAL_ADDRESS",
	704: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
	705: "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
	719: "CUDA_ERROR_LAUNCH_FAILED",
	801: "CUDA_ERROR_NOT_SUPPORTED",
	802: "CUDA_ERROR_SYSTEM_NOT_READY",
	803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
	999: "CUDA_ERROR_UNKNOWN",
}

// Error is a failed CUDA driver call. The filesystem maps it to EIO, except
// CUDA_ERROR_OUT_OF_MEMORY, which matches gpu.ErrOutOfMemory (ENOSPC), and
// CUDA_ERROR_NO_DEVICE / CUDA_ERROR_INVALID_DEVICE, which match gpu.ErrNoDevice.
type Error struct {
	// Op is the driver function that failed, e.g. "cuMemAlloc_v2".
	Op string
	// Code is the CUresult it returned.
	Code int
	// Name is the CUresult's name, e.g. "CUDA_ERROR_OUT_OF_MEMORY", as
	// cuGetErrorName gives it.
	Name string
}

// Error implements error: "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2)".
func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s (%d)", e.Op, e.Name, e.Code)
}

// Is makes errors.Is(err, gpu.ErrOutOfMemory) true for CUDA_ERROR_OUT_OF_MEMORY
// and errors.Is(err, gpu.ErrNoDevice) true for the no-such-device codes.
func (e *Error) Is(target error) bool {
	switch target {
	case gpu.ErrOutOfMemory:
		return result(e.Code) == errOutOfMemory
	case gpu.ErrNoDevice:
		return result(e.Code) == errNoDevice || result(e.Code) == errInvalidDevice
	}
	return false
}

// check turns a CUresult into nil or an *Error named by the driver.
func check(drv driver, op string, r result) error {
	if r == success {
		return nil
	}
	return &Error{Op: op, Code: int(r), Name: errorName(drv, r)}
}

// errorName asks the driver first (it knows codes newer than this file) and
// falls back to the built-in table, then to a numeric name.
func errorName(drv driver, r result) string {
	if drv != nil {
		if n := drv.errorName(r); n != "" {
			return n
		}
	}
	if n, ok := errorNames[r]; ok {
		return n
	}
	return fmt.Sprintf("CUDA_ERROR_%d", int(r))
}
