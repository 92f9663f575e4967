package fs

import (
	"context"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/tensorfs/tensorfs/namespace"
)

// Dir is a directory: the FUSE node of a namespace.Dir, which holds its
// entries and template. go-fuse's child tree of it is only a cache; names
// are decided by the namespace (see namespace.Dir).
type Dir struct {
	gofs.Inode
	fsys *FS
	d    *namespace.Dir
	meta
	kernelHeld
}

// Invalidate implements namespace.Frontend: it tells the kernel to drop
// the attributes it caches for d (after a change the daemon made itself,
// not through the mount). It takes no inode lock in the kernel
// (FUSE_NOTIFY_INVAL_INODE with a negative offset only marks the
// attributes stale), so it is safe from inside any request. A directory the
// kernel has not looked up has nothing cached: that error is ignored.
func (d *Dir) Invalidate() {
	d.NotifyContent(-1, 0)
}

// isRoot reports whether d is the mount's root directory.
func (d *Dir) isRoot() bool { return d.d.IsRoot() }

// attrTimeout is how long the kernel may keep a node's attributes (a
// directory's or a file's). With default_permissions the kernel checks the
// mode before every setxattr, lookup, create, unlink and rename; with a
// timeout of 0 each check is a GETATTR round trip (one of the three FUSE
// requests of an in-place copy_to on a path, four per committed rename).
// Attributes change either through the kernel, which then drops or updates
// what it caches, or inside the daemon, which then tells the kernel
// (Frontend.Invalidate: a directory made for a copy; for a file,
// tensor.OnAttrChange, any change of its size, blocks or nlink, and
// namespace.File.Touched, its mtime after an action), so caching them
// never shows a stale value.
const attrTimeout = time.Second

// kernelHeld records whether the kernel has shown that it holds a node's
// inode: it sent a request for the node itself (GETATTR, STATX, SETATTR).
// Until then a LOOKUP, CREATE or MKDIR reply gives the node's attributes no
// timeout (entryAttrTimeout). The kernel drops a FUSE_NOTIFY_INVAL_INODE for
// an inode it does not hold, and takes the attributes of a reply made before
// the change when the reply arrives after the notice: with a timeout they
// would stay stale for attrTimeout. For an inode it holds, the notice bumps
// the inode's attr_version and the kernel drops such a reply. (It stays set
// after the kernel forgets the inode, which it does only for inodes nobody
// uses; the window is then that of a first lookup racing a change.)
type kernelHeld struct{ held atomic.Bool }

// entryAttrTimeout is the attribute timeout of a reply that names the node
// in an entry (LOOKUP, CREATE, MKDIR).
func (k *kernelHeld) entryAttrTimeout() time.Duration {
	if k.held.Load() {
		return attrTimeout
	}
	return 0
}

// attrNode is a node whose attributes an entry reply carries: attrs fills
// them without counting as the kernel's request (Getattr does).
type attrNode interface {
	attrs(out *fuse.AttrOut)
	entryAttrTimeout() time.Duration
}

// Getattr implements gofs.NodeGetattrer: the kernel's request, which also
// shows that it holds the inode (kernelHeld).
func (d *Dir) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.held.Store(true)
	d.attrs(out)
	return 0
}

// attrs fills out with the directory's attributes, cached for attrTimeout.
func (d *Dir) attrs(out *fuse.AttrOut) {
	out.SetTimeout(attrTimeout)
	d.meta.fill(&out.Attr)
	out.Nlink = 2 + uint32(d.d.Subdirs())
	out.Size = blockSize
}

// Setattr implements gofs.NodeSetattrer: mode, owner and times; a size on a
// directory is EISDIR.
func (d *Dir) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if _, ok := in.GetSize(); ok {
		return syscall.EISDIR
	}
	d.meta.setattr(in)
	return d.Getattr(ctx, f, out)
}

// Lookup implements gofs.NodeLookuper.
func (d *Dir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if errno := checkName(name); errno != 0 {
		return nil, errno
	}
	n := d.d.Child(name)
	if n == nil {
		return nil, syscall.ENOENT
	}
	c := d.fsys.inode(ctx, &d.Inode, n)
	an := c.Operations().(attrNode)
	var a fuse.AttrOut
	an.attrs(&a)
	out.Attr = a.Attr
	out.SetAttrTimeout(an.entryAttrTimeout())
	return c, 0
}

// Mkdir implements gofs.NodeMkdirer; the new directory gets this one's template.
func (d *Dir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	uid, gid := callerOwner(ctx)
	nd, err := d.d.Mkdir(name, mode, uid, gid)
	if err != nil {
		return nil, toErrno("mkdir "+name, err)
	}
	in := d.fsys.inode(ctx, &d.Inode, nd)
	nn := in.Operations().(*Dir)
	var a fuse.AttrOut
	nn.attrs(&a)
	out.Attr = a.Attr
	out.SetAttrTimeout(nn.entryAttrTimeout())
	return in, 0
}

// Rmdir implements gofs.NodeRmdirer.
func (d *Dir) Rmdir(ctx context.Context, name string) syscall.Errno {
	return toErrno("rmdir "+name, d.d.Rmdir(name))
}

// Readdir implements gofs.NodeReaddirer from the namespace's entries,
// sorted by name (a listing must be deterministic).
func (d *Dir) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	entries := d.d.Entries()
	list := make([]fuse.DirEntry, 0, len(entries))
	for _, e := range entries {
		in := d.fsys.inode(ctx, &d.Inode, e.Node)
		list = append(list, fuse.DirEntry{Name: e.Name, Mode: in.Mode(), Ino: in.StableAttr().Ino})
	}
	return gofs.NewListDirStream(list), 0
}

// Unlink implements gofs.NodeUnlinker: the tensor loses its name and is
// released now, or at its last close.
func (d *Dir) Unlink(ctx context.Context, name string) syscall.Errno {
	return toErrno("unlink "+name, d.d.Unlink(name))
}

// Rename implements gofs.NodeRenamer with POSIX semantics (see
// namespace.Dir.Rename); RENAME_NOREPLACE and RENAME_EXCHANGE are honoured,
// other flags are EINVAL.
func (d *Dir) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if errno := checkName(newName); errno != 0 {
		return errno
	}
	if flags&^(gofs.RENAME_EXCHANGE|renameNoReplace) != 0 || flags == gofs.RENAME_EXCHANGE|renameNoReplace {
		return syscall.EINVAL
	}
	np, ok := newParent.(*Dir)
	if !ok {
		return syscall.ENOTDIR
	}
	err := d.d.Rename(name, np.d, newName, flags&gofs.RENAME_EXCHANGE != 0, flags&renameNoReplace != 0)
	return toErrno("rename "+name, err)
}

// renameNoReplace is RENAME_NOREPLACE from linux/fs.h.
const renameNoReplace = 1

// Link implements gofs.NodeLinker: tensors have exactly one name (EPERM).
func (d *Dir) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

// Symlink implements gofs.NodeSymlinker: no symlinks (EPERM).
func (d *Dir) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

// Statfs implements gofs.NodeStatfser.
func (d *Dir) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return d.fsys.statfs(out)
}
