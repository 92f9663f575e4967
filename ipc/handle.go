package ipc

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrHandle is returned, wrapped with what is wrong, for a handle or a
// registration spec that does not parse.
var ErrHandle = errors.New("malformed IPC handle")

// Handle kinds: the prefix before the first ':' of a handle string.
const (
	// KindMemfd is a host memfd, "memfd:/proc/PID/fd/N": the exporting
	// process's fd, opened through its /proc (the form the host backend's
	// ipc_handle shows).
	KindMemfd = "memfd"
	// KindCUDA is a CUDA IPC handle, "cuda:" + 128 hex digits of the 64-byte
	// CUipcMemHandle (CU_IPC_HANDLE_SIZE in cuda.h).
	KindCUDA = "cuda"
)

// CUDAHandleSize is the size of a CUipcMemHandle in bytes
// (CU_IPC_HANDLE_SIZE in cuda.h).
const CUDAHandleSize = 64

// Handle is a parsed IPC handle: the value of user.tensorfs.ipc_handle, of
// a register action (before its range), and of the handles peers exchange.
// It is the one parser of those strings, so that the daemon, its backends
// and its peers agree on what a handle is.
type Handle struct {
	// Kind is KindMemfd or KindCUDA.
	Kind string
	// PID and FD name a memfd's process and descriptor (KindMemfd only).
	PID, FD int
	// CUDA is the raw CUipcMemHandle (KindCUDA only).
	CUDA [CUDAHandleSize]byte
}

// MemfdHandle is the handle string of fd of process pid:
// "memfd:/proc/PID/fd/N".
func MemfdHandle(pid, fd int) string { return Handle{Kind: KindMemfd, PID: pid, FD: fd}.String() }

// ParseHandle parses "memfd:/proc/PID/fd/N" (PID > 0, N >= 0, plain
// decimal) or "cuda:" + 128 hex digits (either case). Errors: ErrHandle,
// wrapped with what is wrong.
func ParseHandle(s string) (Handle, error) {
	kind, ref, ok := strings.Cut(s, ":")
	switch {
	case ok && kind == KindMemfd:
		return parseMemfd(s, ref)
	case ok && kind == KindCUDA:
		h := Handle{Kind: KindCUDA}
		if len(ref) != 2*CUDAHandleSize {
			return Handle{}, fmt.Errorf("CUDA IPC handle with %d hex digits, want %d: %w", len(ref), 2*CUDAHandleSize, ErrHandle)
		}
		if _, err := hex.Decode(h.CUDA[:], []byte(ref)); err != nil {
			return Handle{}, fmt.Errorf("CUDA IPC handle: %v: %w", err, ErrHandle)
		}
		return h, nil
	}
	return Handle{}, fmt.Errorf("%q: want memfd:/proc/PID/fd/N or cuda: + %d hex digits: %w", clip(s), 2*CUDAHandleSize, ErrHandle)
}

func parseMemfd(s, ref string) (Handle, error) {
	f := strings.Split(ref, "/") // "", "proc", PID, "fd", N
	if len(f) != 5 || f[0] != "" || f[1] != "proc" || f[3] != "fd" {
		return Handle{}, fmt.Errorf("%q: want memfd:/proc/PID/fd/N: %w", clip(s), ErrHandle)
	}
	pid, err1 := decimal(f[2])
	fd, err2 := decimal(f[4])
	if err1 != nil || err2 != nil || pid <= 0 {
		return Handle{}, fmt.Errorf("%q: want memfd:/proc/PID/fd/N with PID > 0: %w", clip(s), ErrHandle)
	}
	return Handle{Kind: KindMemfd, PID: pid, FD: fd}, nil
}

// decimal accepts only plain digits: no sign, no spaces, so that a handle
// has exactly one spelling.
func decimal(s string) (int, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, strconv.ErrSyntax
	}
	return strconv.Atoi(s)
}

// String is the canonical handle string (hex in lower case).
func (h Handle) String() string {
	switch h.Kind {
	case KindMemfd:
		return fmt.Sprintf("%s:%s", KindMemfd, h.Path())
	case KindCUDA:
		return KindCUDA + ":" + hex.EncodeToString(h.CUDA[:])
	}
	return ""
}

// Path is a memfd handle's /proc path, "/proc/PID/fd/N" ("" for another
// kind).
func (h Handle) Path() string {
	if h.Kind != KindMemfd {
		return ""
	}
	return fmt.Sprintf("/proc/%d/fd/%d", h.PID, h.FD)
}

// Spec is a parsed registration value, HANDLE[@OFFSET+LENGTH]: the handle
// and, when a range is given, the bytes of the memory it names.
type Spec struct {
	Handle
	// Off is the first byte, Len the length in bytes; Len 0 means from Off
	// (0 without a range) to the end of the memory.
	Off, Len int64
}

// ParseSpec parses a register action's value: surrounding white space is
// dropped, the range is two decimal byte counts with LENGTH > 0. Errors:
// ErrHandle, wrapped with what is wrong.
func ParseSpec(v string) (Spec, error) {
	v = strings.TrimSpace(v)
	var sp Spec
	if at := strings.LastIndexByte(v, '@'); at >= 0 {
		o, l, ok := strings.Cut(v[at+1:], "+")
		off, err1 := decimal(o)
		n, err2 := decimal(l)
		if !ok || err1 != nil || err2 != nil || n <= 0 {
			return Spec{}, fmt.Errorf("%q: the range is @OFFSET+LENGTH in bytes, LENGTH > 0: %w", clip(v), ErrHandle)
		}
		sp.Off, sp.Len, v = int64(off), int64(n), v[:at]
	}
	h, err := ParseHandle(v)
	if err != nil {
		return Spec{}, err
	}
	sp.Handle = h
	return sp, nil
}

// clip shortens a handle for an error message: a value may be up to 64 KiB.
func clip(s string) string {
	if len(s) > 160 {
		return s[:160] + "..."
	}
	return s
}
