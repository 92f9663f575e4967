package fs

import (
	"errors"
	"log"
	"syscall"

	"github.com/tensorfs/tensorfs/gpu"
	"github.com/tensorfs/tensorfs/ipc"
	"github.com/tensorfs/tensorfs/mr"
	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
)

// errnoMap is the one mapping from the domain packages' sentinel errors to the
// errno a FUSE caller sees. Order matters where an error wraps two sentinels
// (an unknown device is both tensor.ErrInvalid and gpu.ErrNoDevice).
var errnoMap = []struct {
	err   error
	errno syscall.Errno
}{
	{tensor.ErrInvalid, syscall.EINVAL},
	{gpu.ErrNoDevice, syscall.EINVAL},
	{gpu.ErrInvalidSize, syscall.EINVAL},
	{tensor.ErrTooLarge, syscall.EFBIG},
	{gpu.ErrOutOfMemory, syscall.ENOSPC},
	{tensor.ErrBusy, syscall.EBUSY},
	{tensor.ErrNoData, syscall.ENODATA},
	{tensor.ErrReleased, syscall.ESTALE},
	{ipc.ErrRevoked, syscall.ESTALE},
	{mr.ErrNotFound, syscall.ENOENT},
	{ipc.ErrNotFound, syscall.ENOENT},
	{gpu.ErrNoDriver, syscall.EIO},
	{gpu.ErrHandle, syscall.EINVAL},
	{gpu.ErrGone, syscall.EIO},
	{tensor.ErrForeign, syscall.EPERM},
}

// toErrno maps err to an errno; op names the operation for the log. An error
// that carries an errno (a copy's transfer.Error, a syscall's) keeps it. Unknown
// errors are logged and become EIO (never go-fuse's generic ENOSYS, which would
// make the kernel stop sending the operation for the life of the mount).
func toErrno(op string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var errno syscall.Errno
	if errors.As(err, &errno) && errno != syscall.ENOSYS && errno != 0 {
		return errno
	}
	for _, m := range errnoMap {
		if errors.Is(err, m.err) {
			return m.errno
		}
	}
	log.Printf("%s: %v (EIO)", op, err)
	return syscall.EIO
}

// copyErr gives err the errno of errnoMap for the copy engine, which sends
// a failure to the peer as an errno and a message (transfer.Errno): a
// domain error with no errno in its chain would reach the peer's caller
// as EIO. Errors that carry an errno, and unknown ones (EIO), pass as they
// are.
func copyErr(err error) error {
	if err == nil {
		return nil
	}
	var errno syscall.Errno
	if errors.As(err, &errno) && errno != 0 {
		if errno == syscall.ESTALE {
			return &transfer.Error{Errno: syscall.ENOENT, Msg: err.Error()}
		}
		return err
	}
	for _, m := range errnoMap {
		if errors.Is(err, m.err) {
			if m.errno == syscall.ESTALE {
				// A tensor released mid-copy (its temporary removed, say)
				// is gone: ENOENT. ESTALE would make the caller's kernel
				// run the whole setxattr, the copy, again.
				return &transfer.Error{Errno: syscall.ENOENT, Msg: err.Error()}
			}
			return &transfer.Error{Errno: m.errno, Msg: err.Error()}
		}
	}
	return err
}

// actionErrno is toErrno for the copy actions (copy_to, copy_from, batch):
// never ESTALE, on which the kernel repeats a path-based setxattr, so that
// one call would run a copy twice (a peer of an older version may still
// send it).
func actionErrno(op string, err error) syscall.Errno {
	errno := toErrno(op, err)
	if errno == syscall.ESTALE {
		return syscall.ENOENT
	}
	return errno
}
