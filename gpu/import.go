package gpu

import "errors"

// ErrHandle: an IPC handle that is malformed, of a kind the device does not
// import ("cuda:" on the host backend), or that names memory the caller may
// not use. The filesystem maps it to EINVAL (EACCES where permission is the
// reason: the caller checks that before Import).
var ErrHandle = errors.New("invalid IPC handle")

// ErrGone: imported memory that its owner took away (a foreign memfd shrunk
// below the imported range). The filesystem maps it to EIO.
var ErrGone = errors.New("imported memory is gone")

// Importer is implemented by devices that can open memory another process
// exported: the host backend opens "memfd:/proc/PID/fd/N" paths, the CUDA
// backend "cuda:" + 128 hex digits (cuIpcOpenMemHandle). Implementations are
// safe for concurrent use.
type Importer interface {
	// Import opens [off, off+n) of the allocation behind handle and returns it
	// as a Buffer on this device; n == 0 means from off to the allocation's
	// end. The Buffer is not tensorfs's memory: it does not count in MemInfo,
	// its ID is a new never-reused id, Offset is off, Handle is a handle other
	// processes can open for the same memory, and Free unmaps (closes the fd,
	// cuIpcCloseMemHandle) without freeing what the owner allocated.
	//
	// A backend may share one mapping among the buffers imported from one
	// handle (CUDA maps an allocation once per context, and an open costs
	// about 0.1 ms); the mapping then closes with the last of them.
	//
	// Memory that can shrink under tensorfs (a foreign memfd without
	// F_SEAL_SHRINK) is accessed with pread/pwrite, never mapped, so a shrink
	// costs an error wrapping ErrGone on the next access, never a SIGBUS.
	// Errors: ErrHandle (malformed, wrong kind, not openable),
	// ErrInvalidSize (a range outside the allocation), ErrNoDriver.
	Import(handle string, off, n int64) (Buffer, error)
}
