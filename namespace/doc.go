// Package namespace is tensorfs's directory tree without FUSE: directories
// and tensor entries with parent pointers, their metadata (mode, owner,
// times, ordinary user xattrs), directory templates, and the copies that
// land in the tree (copy destinations staged, committed and aborted; the
// transfer.Local the peer service reads and writes through; local copies,
// batches, imports of peers' memory and the register action). Package fs is
// the thin go-fuse frontend over it: it wraps each entry in a node, and
// implements Placer, through which a commit renames a copied tensor into
// place through the mount (so inotify watchers see IN_MOVED_TO).
//
// Errors are ordinary errors: a domain sentinel (tensor.ErrInvalid, ...), a
// syscall.Errno, or a *transfer.Error carrying an errno for the copy engine.
// Errno maps them; the FUSE frontend turns them into the errno it answers.
//
// # Lock order
//
// The FUSE frontend calls into the namespace from its node methods, with no
// lock of its own held; the namespace never calls back into the frontend
// (Frontend.Invalidate, Placer) while it holds a directory's lock. The locks
// nest in this order, outermost first:
//
//  1. a Dir's entries lock (two at once only through lockPair: by node id);
//  2. a node's Meta lock, a Dir's template lock, a node's frontend lock;
//  3. go-fuse's own locks (taken by the frontend's constructor that Front
//     runs under the node's frontend lock) and the tensor package's.
//
// A Placer's rename goes through the kernel and back into the frontend's
// Rename, which takes entries locks: Commit calls it with no namespace lock
// held.
package namespace
