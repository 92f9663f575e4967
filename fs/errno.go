package fs

import (
	"context"
	"fmt"
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

// refuse is how a tensorfs attribute's set or removal on node n fails:
// namespace.Tree.Refuse maps err to its errno, logs the reason once and
// keeps it for stats (errors.recent), with the caller's pid; 0 for nil.
func (fsys *FS) refuse(ctx context.Context, n namespace.Node, attr string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if namespace.Errno(err) == syscall.ENODATA {
		// Removing a template attribute that is not set: an absence, as
		// for any xattr (tensorfs import clears them so), not a refusal.
		return syscall.ENODATA
	}
	var pid uint32
	if c := caller(ctx); c != nil {
		pid = c.PID
	}
	return fsys.tree.Refuse(pid, fsys.tree.Path(n), attr, err)
}

// errnoErr is a refusal that the frontend decides itself: errno, with why.
func errnoErr(errno syscall.Errno, format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), errno)
}
