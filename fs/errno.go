package fs

import (
	"log"
	"syscall"

	"github.com/tensorfs/tensorfs/namespace"
)

// toErrno maps err to an errno; op names the operation for the log. An
// error that carries an errno (a copy's transfer.Error, a syscall's) keeps
// it; a domain sentinel gets namespace.Errno's. Unknown errors are logged
// and become EIO (never go-fuse's generic ENOSYS, which would make the
// kernel stop sending the operation for the life of the mount).
func toErrno(op string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if errno := namespace.Errno(err); errno != 0 {
		return errno
	}
	log.Printf("%s: %v (EIO)", op, err)
	return syscall.EIO
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
