package fs

import (
	"context"
	"sort"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/tensorfs/tensorfs/dtype"
	"github.com/tensorfs/tensorfs/tensor"
)

// Dir is a directory. It may carry a template (dtype, shape, device) that every
// tensor created in it gets; mkdir copies it to the new directory.
//
// Its entries are its own map, not go-fuse's child tree: go-fuse re-inserts
// whatever a LOOKUP returned after the handler has returned, and the kernel's
// revalidating lookups run without the directory lock, so a lookup racing a
// rename over the same name would put the replaced tensor back under the name
// and orphan the new one (seen as leaked tensors under churn). go-fuse's tree
// is only a cache here; names are decided by entries.
type Dir struct {
	gofs.Inode
	fsys *FS
	meta

	mu      sync.Mutex
	entries map[string]*gofs.Inode
	subdirs int // entries that are directories, for nlink without a scan

	tmplMu sync.Mutex
	tmpl   tensor.Template
}

// child returns the entry for name, or nil.
func (d *Dir) child(name string) *gofs.Inode {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.entries[name]
}

// empty reports whether the directory has no entries.
func (d *Dir) empty() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.entries) == 0
}

// lockPair locks two directories in a fixed order (by inode number) so that
// concurrent renames between them cannot deadlock; it returns the unlock.
func lockPair(a, b *Dir) func() {
	if a == b {
		a.mu.Lock()
		return a.mu.Unlock
	}
	if a.StableAttr().Ino > b.StableAttr().Ino {
		a, b = b, a
	}
	a.mu.Lock()
	b.mu.Lock()
	return func() { b.mu.Unlock(); a.mu.Unlock() }
}

func (d *Dir) nodeMeta() *meta { return &d.meta }

func (d *Dir) template() tensor.Template {
	d.tmplMu.Lock()
	defer d.tmplMu.Unlock()
	t := d.tmpl
	t.Shape = append(dtype.Shape(nil), d.tmpl.Shape...)
	if d.tmpl.Shape != nil && t.Shape == nil {
		t.Shape = dtype.Shape{}
	}
	return t
}

// invalidateAttr tells the kernel to drop the attributes it caches for d
// (after a change the daemon made itself, not through the mount). It takes
// no inode lock in the kernel (FUSE_NOTIFY_INVAL_INODE with a negative
// offset only marks the attributes stale), so it is safe from inside any
// request, the deadlock trap's included. A directory the kernel has not
// looked up has nothing cached: that error is expected and ignored.
func (d *Dir) invalidateAttr() {
	d.NotifyContent(-1, 0)
}

// isRoot reports whether d is the mount's root directory.
func (d *Dir) isRoot() bool { return d == d.fsys.root }

// dirAttrTimeout is how long the kernel may keep a directory's attributes.
// With default_permissions the kernel checks the directory's mode before
// every lookup, create, unlink and rename in it; with a timeout of 0 each
// check is a GETATTR round trip (four per rename). A directory's attributes
// change only through the kernel (setattr, entries made or removed through
// the mount, after which the kernel drops what it cached) or through
// mkdirAll, which tells the kernel (invalidateAttr), so caching them never
// shows a stale value. Tensor files keep 0: peers change their size.
const dirAttrTimeout = time.Second

// Getattr implements gofs.NodeGetattrer.
func (d *Dir) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.SetTimeout(dirAttrTimeout)
	d.meta.fill(&out.Attr)
	out.Nlink = 2
	out.Size = blockSize
	d.mu.Lock()
	out.Nlink += uint32(d.subdirs)
	d.mu.Unlock()
	return 0
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
	c := d.child(name)
	if c == nil {
		return nil, syscall.ENOENT
	}
	var a fuse.AttrOut
	if errno := c.Operations().(gofs.NodeGetattrer).Getattr(ctx, nil, &a); errno != 0 {
		return nil, errno
	}
	out.Attr = a.Attr
	out.SetAttrTimeout(a.Timeout())
	return c, 0
}

// Mkdir implements gofs.NodeMkdirer; the new directory gets this one's template.
func (d *Dir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if errno := checkName(name); errno != 0 {
		return nil, errno
	}
	child := &Dir{fsys: d.fsys, tmpl: d.template()}
	child.meta.init(ctx, mode)
	d.mu.Lock()
	if d.entries[name] != nil {
		d.mu.Unlock()
		return nil, syscall.EEXIST
	}
	in := d.NewPersistentInode(ctx, child, gofs.StableAttr{Mode: syscall.S_IFDIR})
	d.setEntry(name, in)
	d.mu.Unlock()
	var a fuse.AttrOut
	child.Getattr(ctx, nil, &a)
	out.Attr = a.Attr
	out.SetAttrTimeout(a.Timeout())
	return in, 0
}

// Rmdir implements gofs.NodeRmdirer.
func (d *Dir) Rmdir(ctx context.Context, name string) syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.entries[name]
	if c == nil {
		return syscall.ENOENT
	}
	sub, ok := c.Operations().(*Dir)
	if !ok {
		return syscall.ENOTDIR
	}
	if !sub.empty() {
		return syscall.ENOTEMPTY
	}
	d.delEntry(name)
	return 0
}

// setEntry adds or replaces an entry; d.mu is held.
func (d *Dir) setEntry(name string, in *gofs.Inode) {
	if d.entries == nil {
		d.entries = map[string]*gofs.Inode{}
	}
	d.delEntry(name)
	d.entries[name] = in
	if in.IsDir() {
		d.subdirs++
	}
}

// delEntry removes an entry if present; d.mu is held.
func (d *Dir) delEntry(name string) {
	if old, ok := d.entries[name]; ok {
		if old.IsDir() {
			d.subdirs--
		}
		delete(d.entries, name)
	}
}

// Readdir implements gofs.NodeReaddirer from the directory's own entries,
// sorted by name (a listing must be deterministic).
func (d *Dir) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	d.mu.Lock()
	list := make([]fuse.DirEntry, 0, len(d.entries))
	for name, c := range d.entries {
		list = append(list, fuse.DirEntry{Name: name, Mode: c.Mode(), Ino: c.StableAttr().Ino})
	}
	d.mu.Unlock()
	sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
	return gofs.NewListDirStream(list), 0
}

// Unlink implements gofs.NodeUnlinker: the tensor loses its name and is
// released now, or at its last close.
func (d *Dir) Unlink(ctx context.Context, name string) syscall.Errno {
	d.mu.Lock()
	c := d.entries[name]
	if c == nil {
		d.mu.Unlock()
		return syscall.ENOENT
	}
	f, ok := c.Operations().(*File)
	if !ok {
		d.mu.Unlock()
		return syscall.EISDIR
	}
	d.delEntry(name)
	d.mu.Unlock()
	f.t.Unlink()
	return 0
}

// Rename implements gofs.NodeRenamer with POSIX semantics: a tensor renamed over
// another one unlinks it (released at its last close); a directory replaces only
// an empty directory. RENAME_NOREPLACE and RENAME_EXCHANGE are honoured.
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
	unlock := lockPair(d, np)
	src := d.entries[name]
	if src == nil {
		unlock()
		return syscall.ENOENT
	}
	dst := np.entries[newName]
	if flags&gofs.RENAME_EXCHANGE != 0 {
		if dst == nil {
			unlock()
			return syscall.ENOENT
		}
		d.delEntry(name)
		np.delEntry(newName)
		d.setEntry(name, dst)
		np.setEntry(newName, src)
		unlock()
		return 0
	}
	if dst == src {
		unlock()
		return 0
	}
	var replaced *File
	if dst != nil {
		if flags&renameNoReplace != 0 {
			unlock()
			return syscall.EEXIST
		}
		switch dd, isDir := dst.Operations().(*Dir); {
		case isDir && !src.IsDir():
			unlock()
			return syscall.EISDIR
		case !isDir && src.IsDir():
			unlock()
			return syscall.ENOTDIR
		case isDir && !dd.empty():
			unlock()
			return syscall.ENOTEMPTY
		case !isDir:
			replaced = dst.Operations().(*File)
		}
	}
	d.delEntry(name)
	np.setEntry(newName, src)
	unlock()
	if replaced != nil {
		replaced.t.Unlink()
	}
	return 0
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
