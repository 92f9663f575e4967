package namespace

import (
	"errors"
	"log/slog"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Refusal is one refused attribute set or action, as stats lists it under
// errors.recent: when, by which process (the FUSE caller's thread id), on
// which path (mount-relative) and attribute (its full name), the errno
// (its name, e.g. "EINVAL") and why, in words.
type Refusal struct {
	// ID numbers the refusals from 1, so that a client tells the ones
	// after its call from earlier ones.
	ID     int64     `json:"id"`
	Time   time.Time `json:"time"`
	PID    uint32    `json:"pid"`
	Path   string    `json:"path"`
	Attr   string    `json:"attr"`
	Errno  string    `json:"errno"`
	Reason string    `json:"reason"`
}

// Errors is stats' errors: how many refusals since start, and the last
// recentRefusals of them, oldest first.
type Errors struct {
	Total  int64     `json:"total"`
	Recent []Refusal `json:"recent"`
}

// recentRefusals is how many refusals stats keeps: enough for a client to
// find its own (tensorfs cp, the Python client: by pid and path) right
// after the call, small enough that stats stays well under 64 KiB.
const recentRefusals = 16

// maxReason bounds a refusal's reason in stats, in bytes (a batch's error
// may quote its value).
const maxReason = 300

// refusals is the ring behind Errors.
type refusals struct {
	mu     sync.Mutex
	total  int64
	recent []Refusal // at most recentRefusals, oldest first
}

// Refuse is the one place an attribute set or action that fails becomes
// its errno (DESIGN.md: "A bad value gives EINVAL and changes nothing"; a
// refusal's reason is in the log and in stats): it maps err (Errno; an
// error it does not know is EIO), logs the refusal once with the path, the
// attribute and the reason (unless the copy code has logged it already,
// with its value), and records it for stats' errors.recent. pid is the
// caller's (0 when unknown). It returns the errno, 0 for a nil err.
func (f *Tree) Refuse(pid uint32, path, attr string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	errno := Errno(err)
	if errno == 0 {
		errno = syscall.EIO
	}
	name := unix.ErrnoName(errno)
	var le loggedError
	if !errors.As(err, &le) {
		slog.Warn("refused", "attr", attr, "on", path, "errno", name, "pid", pid, "err", err)
	}
	reason := err.Error()
	if len(reason) > maxReason {
		reason = reason[:maxReason] + "..."
	}
	r := &f.refusals
	r.mu.Lock()
	defer r.mu.Unlock()
	r.total++
	if len(r.recent) == recentRefusals {
		r.recent = append(r.recent[:0], r.recent[1:]...)
	}
	r.recent = append(r.recent, Refusal{ID: r.total, Time: time.Now().UTC(), PID: pid, Path: path, Attr: attr, Errno: name, Reason: reason})
	return errno
}

// errorStats is the errors part of the stats document.
func (f *Tree) errorStats() Errors {
	r := &f.refusals
	r.mu.Lock()
	defer r.mu.Unlock()
	return Errors{Total: r.total, Recent: append([]Refusal{}, r.recent...)}
}
