package fs

import (
	"log/slog"
	"syscall"

	"github.com/tensorfs/tensorfs/namespace"
)

// toErrno is the one place a FUSE method turns an error into the errno it
// answers; op names the operation for the log. An
// error that carries an errno (a copy's transfer.Error, a syscall's) keeps
// it; a domain sentinel gets namespace.Errno's. Unknown errors are logged
// and become EIO (never go-fuse's generic ENOSYS, which would make the
// kernel stop sending the operation for the life of the mount). The copy
// actions (copy_to, copy_from, batch) never give ESTALE, on which the
// kernel repeats a path-based setxattr and so would run a copy twice: the
// namespace's copies return ENOENT instead.
func toErrno(op string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if errno := namespace.Errno(err); errno != 0 {
		return errno
	}
	slog.Error("unexpected failure, returned as EIO", "op", op, "errno", "EIO", "err", err)
	return syscall.EIO
}
