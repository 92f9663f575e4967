package fs

import (
	"context"
	"sync"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/tensorfs/tensorfs/tensor"
)

// Dir is a directory. It may carry a template (dtype, shape, device) that every
// tensor created in it gets; mkdir copies it to the new directory.
type Dir struct {
	gofs.Inode
	fsys *FS
	meta

	tmplMu sync.Mutex
	tmpl   tensor.Template
}

func (d *Dir) nodeMeta() *meta { return &d.meta }

func (d *Dir) template() tensor.Template {
	d.tmplMu.Lock()
	defer d.tmplMu.Unlock()
	t := d.tmpl
	t.Shape = append(tensor.Shape(nil), d.tmpl.Shape...)
	if d.tmpl.Shape != nil && t.Shape == nil {
		t.Shape = tensor.Shape{}
	}
	return t
}

// isRoot reports whether d is the mount's root directory.
func (d *Dir) isRoot() bool { return d == d.fsys.root }

// Getattr implements gofs.NodeGetattrer.
func (d *Dir) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.meta.fill(&out.Attr)
	out.Nlink = 2
	out.Size = blockSize
	for _, c := range d.Children() {
		if c.IsDir() {
			out.Nlink++
		}
	}
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
	c := d.GetChild(name)
	if c == nil {
		return nil, syscall.ENOENT
	}
	var a fuse.AttrOut
	if errno := c.Operations().(gofs.NodeGetattrer).Getattr(ctx, nil, &a); errno != 0 {
		return nil, errno
	}
	out.Attr = a.Attr
	return c, 0
}

// Mkdir implements gofs.NodeMkdirer; the new directory gets this one's template.
func (d *Dir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if errno := checkName(name); errno != 0 {
		return nil, errno
	}
	if d.GetChild(name) != nil {
		return nil, syscall.EEXIST
	}
	child := &Dir{fsys: d.fsys, tmpl: d.template()}
	child.meta.init(ctx, mode)
	in := d.NewPersistentInode(ctx, child, gofs.StableAttr{Mode: syscall.S_IFDIR})
	var a fuse.AttrOut
	child.Getattr(ctx, nil, &a)
	out.Attr = a.Attr
	return in, 0
}

// Rmdir implements gofs.NodeRmdirer.
func (d *Dir) Rmdir(ctx context.Context, name string) syscall.Errno {
	c := d.GetChild(name)
	if c == nil {
		return syscall.ENOENT
	}
	if !c.IsDir() {
		return syscall.ENOTDIR
	}
	if len(c.Children()) > 0 {
		return syscall.ENOTEMPTY
	}
	return 0
}

// Unlink implements gofs.NodeUnlinker: the tensor loses its name and is
// released now, or at its last close.
func (d *Dir) Unlink(ctx context.Context, name string) syscall.Errno {
	c := d.GetChild(name)
	if c == nil {
		return syscall.ENOENT
	}
	f, ok := c.Operations().(*File)
	if !ok {
		return syscall.EISDIR
	}
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
	src := d.GetChild(name)
	if src == nil {
		return syscall.ENOENT
	}
	dst := np.GetChild(newName)
	if flags&gofs.RENAME_EXCHANGE != 0 {
		if dst == nil {
			return syscall.ENOENT
		}
		return 0
	}
	if dst == nil || dst == src {
		return 0
	}
	if flags&renameNoReplace != 0 {
		return syscall.EEXIST
	}
	switch {
	case dst.IsDir() && !src.IsDir():
		return syscall.EISDIR
	case !dst.IsDir() && src.IsDir():
		return syscall.ENOTDIR
	case dst.IsDir():
		if len(dst.Children()) > 0 {
			return syscall.ENOTEMPTY
		}
	default:
		dst.Operations().(*File).t.Unlink()
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

// Mknod implements gofs.NodeMknoder: only regular files, through create (EPERM).
func (d *Dir) Mknod(ctx context.Context, name string, mode, dev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

// Statfs implements gofs.NodeStatfser.
func (d *Dir) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return d.fsys.statfs(out)
}
