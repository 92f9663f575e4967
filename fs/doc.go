// Package fs is tensorfs's FUSE frontend: a go-fuse node tree over the
// FUSE-free namespace (package namespace) and tensor store. Each node wraps
// a namespace entry (made on first use: Lookup, Readdir, Create, Mkdir) and
// translates FUSE operations to namespace and tensor calls and their errors
// to errnos. It keeps only what is FUSE-specific: attributes and xattrs as
// the kernel sees them, callers from the request context, and the placement
// of a copy's tensors by a rename through the mount (place.go). What follows
// are the decisions a reader must know before changing any of it.
//
// # Kernel caching and timeouts
//
// The mount uses entry and negative timeouts of 0 (mount.go), so the
// kernel asks again at every lookup: the daemon renames and replaces
// entries itself (a batch's whole tensors, copy_from into a directory),
// and telling the kernel of a name would need FUSE_NOTIFY_INVAL_ENTRY,
// which takes the parent directory's inode lock: inside a setxattr on that
// directory it would hang (the trap below).
//
// Attributes, a directory's and a file's, are cached for attrTimeout (1 s,
// dir.go): with default_permissions the kernel checks the mode before
// every setxattr, lookup and rename, which with a timeout of 0 cost a
// GETATTR each (an in-place copy_to on a path costs two FUSE requests,
// LOOKUP and SETXATTR, where it cost three; on an open fd one, where it
// cost two). They change through the kernel (which drops or updates its
// copy) or inside the daemon, which then sends FUSE_NOTIFY_INVAL_INODE
// (Invalidate; it takes no inode lock, so it is safe inside any request,
// a setxattr on that very file included): a directory made for a copy,
// every change of a tensor's size, capacity or link whoever makes it
// (tensor.OnAttrChange: a copy_from's adoption, a batch replacing a file,
// a shape that allocates, a registration), and a file's mtime after an
// action (namespace.File.Touched).
//
// The kernel drops such a notice for an inode it does not hold yet, and
// would then cache the attributes of a LOOKUP reply made before the
// change: so a reply naming a node gives its attributes a timeout only
// once the kernel has shown it holds the node (a GETATTR, STATX or SETATTR
// of it: kernelHeld, dir.go); for a held inode the notice's attr_version
// makes the kernel drop a reply older than it. So "stat right after any
// change shows it" holds.
//
// Data I/O is direct I/O (no page cache), so a write by another process
// through an IPC mapping is seen by the next read.
//
// # Why the tree keeps its own entries
//
// go-fuse's inode tree is the kernel's view, and the kernel forgets inodes
// when it likes (FORGET). The namespace's map of entries is the truth:
// names exist while they are linked, tensors while they are linked or open
// (their own refcount in package tensor), whatever the kernel remembers.
// FORGET and unmount are backstops, never the release of a tensor. It also
// lets copies from peers create, stage and commit entries without a FUSE
// request, and keeps nlink 0 after unlink while handles are open.
//
// # The setxattr deadlock trap
//
// For the whole setxattr call the kernel holds the inode lock of the file
// or directory whose attribute is set. An action (copy_to, copy_from,
// batch, register) therefore never makes a syscall on this mount that
// needs that lock: copy_from swaps the target's allocation inside the daemon
// (tensor.Adopt) instead of renaming over it, a copy onto itself is EINVAL,
// register reads /proc only. A copy_to's commit does rename through the mount
// (so inotify watchers see IN_MOVED_TO), which is safe for other files,
// but another process can close a lock cycle with it (an rm or mv that
// holds the destination directory and waits for the source). So every
// rename and lookup through the mount is bounded (renameStuckAfter, 2 s,
// place.go): past it the tensor is put in place inside the daemon, still
// atomic, without the inotify event, and the late kernel rename fails
// harmlessly.
//
// # Errors and ESTALE
//
// Every FUSE method answers through toErrno (errno.go): an error that
// carries an errno keeps it, a domain sentinel gets namespace.Errno's, and
// anything else is logged and becomes EIO. Never ENOSYS: the kernel would
// stop sending that operation for the life of the mount. A tensor released
// under a handle is ESTALE for data I/O, but never for the copy actions:
// on ESTALE the kernel repeats a path-based setxattr, which would run a
// copy twice, so copies answer ENOENT instead (namespace's copyErr).
//
// # Interrupts
//
// Copies run detached from the request's context (namespace.CopyContext):
// a Go client's runtime sends FUSE interrupts all the time, and a copy
// runs to completion or failure; a client killed mid-copy does not see the
// result, but the destination is the old tensor or the new one.
//
// # Locks
//
// See the namespace package's lock order; a node method holds no lock of
// its own while it calls the namespace.
//
// # Counting requests
//
// With Options.Counts (tensorfs mount --metrics), the raw file system
// go-fuse builds over the nodes is wrapped by one that counts each request
// by operation and each errno answered (opcount.go): the one place that
// sees every reply's status, so no handler counts anything and an errno
// returned directly (EPERM for a read-only attribute) is counted like one
// from toErrno. Without it the wrapper is not there at all.
package fs
