package fs

import (
	"context"
	"fmt"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/tensorfs/tensorfs/namespace"
)

// newFile makes a tensor file named name, allocated and registered at once
// when the directory's template has a shape, else empty. open, when true,
// also returns an open handle (create(2)); the name is added only once
// everything has succeeded, so a failure leaves nothing behind.
func (d *Dir) newFile(ctx context.Context, name string, mode uint32, flags uint32, open bool, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if errno := checkName(name); errno != 0 {
		return nil, nil, 0, errno
	}
	if mode&syscall.S_IFMT != 0 && mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, nil, 0, syscall.EPERM
	}
	if d.d.Child(name) != nil {
		return nil, nil, 0, syscall.EEXIST
	}
	tmpl := d.d.Template()
	uid, gid := callerOwner(ctx)
	if _, ok := fuse.FromContext(ctx); ok {
		tmpl.Owner = uid
	}
	t, err := d.fsys.tree.Store().New(tmpl)
	if err != nil {
		return nil, nil, 0, toErrno(fmt.Sprintf("create %s", name), err)
	}
	nf := namespace.NewFile(t, mode, uid, gid)
	in := d.fsys.inode(ctx, &d.Inode, nf)
	f := in.Operations().(*File)
	var fh gofs.FileHandle
	var fuseFlags uint32
	if open {
		var errno syscall.Errno
		if fh, fuseFlags, errno = f.Open(ctx, flags); errno != 0 {
			t.Unlink()
			return nil, nil, 0, errno
		}
	}
	if err := d.d.Add(name, nf); err != nil {
		// Lost a race with another create of the name: the kernel holds the
		// directory lock for creates, so this is a safety net only.
		if fh != nil {
			fh.(*handle).h.Close()
		}
		t.Unlink()
		return nil, nil, 0, toErrno("create "+name, err)
	}
	var a fuse.AttrOut
	f.attrs(&a)
	out.Attr = a.Attr
	out.SetAttrTimeout(f.entryAttrTimeout())
	return in, fh, fuseFlags, 0
}

// Create implements gofs.NodeCreater (open with O_CREAT).
func (d *Dir) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	return d.newFile(ctx, name, mode, flags, true, out)
}

// Mknod implements gofs.NodeMknoder: a regular file is created like by
// create(2); device nodes, FIFOs and sockets are EPERM.
func (d *Dir) Mknod(ctx context.Context, name string, mode, dev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	in, _, _, errno := d.newFile(ctx, name, mode, 0, false, out)
	return in, errno
}
