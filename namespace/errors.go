package namespace

import (
	"errors"
	"syscall"

	"github.com/tensorfs/tensorfs/gpu"
	"github.com/tensorfs/tensorfs/ipc"
	"github.com/tensorfs/tensorfs/mr"
	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
)

// errnoMap is the one mapping from the domain packages' sentinel errors to
// the errno a caller sees (through FUSE, or through a peer's copy). Order
// matters where an error wraps two sentinels (an unknown device is both
// tensor.ErrInvalid and gpu.ErrNoDevice).
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

// Errno is the errno of err: the one it carries (a syscall.Errno or a
// copy's *transfer.Error in its chain, ENOSYS excepted), else that of the
// first domain sentinel it wraps (tensor.ErrInvalid → EINVAL,
// gpu.ErrOutOfMemory → ENOSPC, tensor.ErrReleased → ESTALE, ...); 0 for nil
// and for an error it does not know (the caller decides: the FUSE frontend
// logs it and answers EIO).
func Errno(err error) syscall.Errno {
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
	return 0
}

// copyErr gives err the errno of errnoMap for the copy engine, which sends
// a failure to the peer as an errno and a message (transfer.Errno): a
// domain error with no errno in its chain would reach the peer's caller
// as EIO. ESTALE becomes ENOENT: a tensor released mid-copy (its temporary
// removed, say) is gone, and ESTALE would make the caller's kernel run the
// whole setxattr, the copy, again. Errors that carry another errno, and
// unknown ones (EIO), pass as they are.
func copyErr(err error) error {
	if err == nil {
		return nil
	}
	var carried syscall.Errno
	hasErrno := errors.As(err, &carried) && carried != 0
	errno := Errno(err)
	switch {
	case errno == syscall.ESTALE:
		errno = syscall.ENOENT
	case hasErrno || errno == 0:
		return err
	}
	out := error(&transfer.Error{Errno: errno, Msg: err.Error()})
	if errors.As(err, new(loggedError)) {
		out = loggedError{out} // still logged: Tree.Refuse logs it once
	}
	return out
}
