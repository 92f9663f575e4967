package fs

import (
	"errors"
	"log/slog"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/namespace"
)

// placer implements namespace.Placer for a mounted tree: a copy's tensors
// are renamed into place through the mount at mnt, so that inotify watchers
// see IN_MOVED_TO.
type placer struct{ mnt string }

// Begin implements namespace.Placer.
func (p placer) Begin() namespace.Placement {
	return &committer{mnt: p.mnt, fds: map[string]int{}}
}

// committer puts a copy's tensors in place. Renames through the mount go
// relative to an fd of each directory, opened once: a full path would make
// the kernel look up every directory of it again for each tensor (entry
// timeouts are 0).
type committer struct {
	mnt   string
	fds   map[string]int
	stuck bool // the mount stayed locked: the rest goes in place inside the daemon
}

// End implements namespace.Placement: the directories are closed.
func (c *committer) End() {
	for _, fd := range c.fds {
		unix.Close(fd)
	}
}

// fd opens (once) the directory at mount-relative path rel.
func (c *committer) fd(rel string) (int, error) {
	if fd, ok := c.fds[rel]; ok {
		return fd, nil
	}
	fd, err := openDirWithin(c.mnt + rel)
	if err != nil {
		return -1, err
	}
	c.fds[rel] = fd
	return fd, nil
}

// Rename implements namespace.Placement: it moves fromRel/from to
// toRel/to through the mount, or inside the daemon (internal) once the
// mount is stuck.
func (c *committer) Rename(fromRel, from, toRel, to string, noReplace bool, internal func() error) error {
	if c.stuck {
		return internal()
	}
	var flags uint
	if noReplace {
		flags = unix.RENAME_NOREPLACE
	}
	fromFd, err := c.fd(fromRel)
	if err == nil {
		var toFd int
		if toFd, err = c.fd(toRel); err == nil {
			c.stuck, err = renameViaMount(fromFd, from, toFd, to, flags, internal)
		}
	}
	if errors.Is(err, syscall.ENAMETOOLONG) {
		// A directory deeper than PATH_MAX cannot be opened through the
		// mount by its path: this tensor goes in place inside the daemon.
		slog.Info("put in place: its path is too long to rename through the mount; renamed inside the daemon (no IN_MOVED_TO)", "path", toRel+"/"+to)
		return internal()
	}
	if errors.Is(err, errStuck) {
		c.stuck = true
		err = internal()
	}
	if c.stuck {
		// The kernel holds the directory's lock for someone who waits on
		// us (see renameViaMount): this and the rest go in place inside
		// the daemon, without inotify events.
		slog.Info("put in place: the directory stayed locked; renamed inside the daemon (no IN_MOVED_TO for what is left of this copy)", "path", toRel+"/"+to, "seconds", renameStuckAfter.Seconds())
	}
	return err
}

// renameStuckAfter bounds a rename through the mount. A copy runs inside
// a FUSE request (the setxattr of copy_to, whose source's inode lock the
// kernel holds; or a peer's put while that peer's own setxattr waits on
// us): a process that takes the destination directory's lock and then
// waits for the source's (rm or mv of the source, in the same directory;
// or the same across two daemons copying to each other) would wait on us
// while our rename waits on it. Past this bound the tensor goes in place
// inside the daemon: still atomic, without the inotify event. A rename
// takes about 100 µs; a directory busy for 2 s is such a cycle, or a
// machine too loaded to matter.
const renameStuckAfter = 2 * time.Second

// errStuck: a rename through the mount did not finish within
// renameStuckAfter.
var errStuck = errors.New("rename through the mount is stuck")

// renameViaMount renames from (in directory fd fromFd) to to (in toFd)
// through the mount, with renameat2's flags, so that watchers see
// IN_MOVED_TO. When that does not finish within renameStuckAfter (stuck),
// internal puts it in place inside the daemon instead: the kernel's rename
// may still be waiting for the lock, and when the lock comes free its
// lookup of the temporary finds nothing and it fails harmlessly; if the
// kernel's rename wins that race instead, the internal one finds no
// temporary (ENOENT), and the kernel's result is the outcome.
func renameViaMount(fromFd int, from string, toFd int, to string, flags uint, internal func() error) (stuck bool, err error) {
	late, err := bounded(func() error { return unix.Renameat2(fromFd, from, toFd, to, flags) })
	if late == nil {
		return false, err
	}
	if err := internal(); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			// Either the kernel's rename got the temporary (it is
			// finishing: its result comes at once) or someone else moved
			// or removed it, and the kernel's rename still waits for the
			// lock of a process that may wait on us: do not wait for it.
			select {
			case err := <-late:
				return true, err
			case <-time.After(lateRenameGrace):
				return true, err
			}
		}
		return true, err
	}
	return true, nil
}

// lateRenameGrace is how long renameViaMount waits for the result of a
// late rename that may have taken the temporary (its FUSE request has
// been answered: the syscall is returning).
const lateRenameGrace = time.Second

// openDirWithin opens a destination directory (O_PATH) through the mount;
// errStuck when the lookup does not finish in time (the same lock cycle
// as renameViaMount's: a path walk waits on a locked directory).
func openDirWithin(p string) (int, error) {
	fd := -1
	late, err := bounded(func() (err error) {
		fd, err = unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return err
	})
	if late != nil {
		go func() {
			if <-late == nil {
				unix.Close(fd) // opened after we gave up on it
			}
		}()
		return -1, errStuck
	}
	return fd, err
}

// bounded runs call, a syscall on the mount, on its own goroutine and waits
// at most renameStuckAfter for it. When it is late, late is non-nil and
// delivers its result once it comes (and call's own variables may be read
// only after that); else err is its result.
func bounded(call func() error) (late <-chan error, err error) {
	done := make(chan error, 1)
	go func() { done <- call() }()
	t := time.NewTimer(renameStuckAfter)
	defer t.Stop()
	select {
	case err := <-done:
		return nil, err
	case <-t.C:
		return done, nil
	}
}
