package transfer

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"syscall"
)

// Error is a failure reported by, or about, a peer. Errno is what the
// filesystem returns for it; Copied counts tensors already in place when a
// directory copy failed part-way.
type Error struct {
	Errno  syscall.Errno
	Msg    string
	Copied int
	// broken: the connection itself failed (nothing more can be said on it).
	broken bool
	// recheck: a chunk of a copy summed where its bytes lie
	// (request.Recheck) failed its sum; the copy runs again from
	// snapshots before it is called corrupt.
	recheck bool
}

// Error says what failed, and how many tensors a directory copy had placed
// by then.
func (e *Error) Error() string {
	if e.Copied > 0 {
		return fmt.Sprintf("%s (%d tensors copied before the failure)", e.Msg, e.Copied)
	}
	return e.Msg
}

// Unwrap lets errors.Is(err, syscall.ENOENT) and the like match.
func (e *Error) Unwrap() error { return e.Errno }

// Errno extracts the errno an error should surface as: the one it wraps, or
// EIO.
func Errno(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) && e != 0 {
		return e
	}
	return syscall.EIO
}

// errnoNames are the errnos that cross the wire by name.
var errnoNames = map[string]syscall.Errno{
	"ENOENT": syscall.ENOENT, "EINVAL": syscall.EINVAL, "EACCES": syscall.EACCES,
	"EIO": syscall.EIO, "EISDIR": syscall.EISDIR, "ENOTDIR": syscall.ENOTDIR,
	"ENOSPC": syscall.ENOSPC, "EFBIG": syscall.EFBIG, "EEXIST": syscall.EEXIST,
	"EPROTO": syscall.EPROTO, "ETIMEDOUT": syscall.ETIMEDOUT, "EBUSY": syscall.EBUSY,
	"EPERM": syscall.EPERM, "ENAMETOOLONG": syscall.ENAMETOOLONG, "ESTALE": syscall.ESTALE,
	"ENOTEMPTY": syscall.ENOTEMPTY, "ECONNREFUSED": syscall.ECONNREFUSED,
	"EXDEV": syscall.EXDEV, "EHOSTUNREACH": syscall.EHOSTUNREACH,
	"EPROTONOSUPPORT": syscall.EPROTONOSUPPORT, "ECONNRESET": syscall.ECONNRESET,
}

func errnoName(e syscall.Errno) string {
	for n, v := range errnoNames {
		if v == e {
			return n
		}
	}
	return "EIO"
}

// wireError is a frameError payload: an errno name and a message.
type wireError struct {
	Errno   string `json:"errno"`
	Message string `json:"message"`
	Copied  int    `json:"copied,omitempty"`
	// Recheck: Error.recheck (a release before request.Recheck sends
	// none, and is never asked for such a copy).
	Recheck bool `json:"recheck,omitempty"`
}

// wireToError decodes an error frame; an errno name this node does not know
// is EIO.
func wireToError(peer string, p []byte) error {
	var we wireError
	if json.Unmarshal(p, &we) != nil {
		return &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: malformed error frame", peer)}
	}
	errno, ok := errnoNames[we.Errno]
	if !ok {
		errno = syscall.EIO
	}
	return &Error{Errno: errno, Msg: fmt.Sprintf("%s: %s", peer, we.Message), Copied: we.Copied, recheck: we.Recheck}
}

// isRecheck reports whether err is a failed sum of a copy summed where its
// bytes lie (Error.recheck), which runs again from buffers.
func isRecheck(err error) bool {
	var te *Error
	return errors.As(err, &te) && te.recheck
}

// netErr turns network failures into errnos a copy can report: a deadline
// is ETIMEDOUT, a closed connection EIO.
func netErr(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return &Error{Errno: syscall.ETIMEDOUT, Msg: err.Error(), broken: true}
	}
	if errors.Is(err, ErrFrame) {
		return &Error{Errno: syscall.EPROTO, Msg: err.Error(), broken: true}
	}
	var te *Error
	if errors.As(err, &te) {
		return err
	}
	var errno syscall.Errno
	if errors.As(err, &errno) && (errno == syscall.ECONNREFUSED || errno == syscall.EHOSTUNREACH || errno == syscall.ENETUNREACH || errno == syscall.ETIMEDOUT) {
		return &Error{Errno: errno, Msg: err.Error(), broken: true}
	}
	// A broken connection (EPIPE, ECONNRESET, EOF) mid-copy is an I/O error.
	return &Error{Errno: syscall.EIO, Msg: err.Error(), broken: true}
}
