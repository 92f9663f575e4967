package fs

import (
	"context"
	"fmt"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Create implements gofs.NodeCreater: the tensor is allocated and registered at
// once when the directory's template has a shape, else it starts empty.
func (d *Dir) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if errno := checkName(name); errno != 0 {
		return nil, nil, 0, errno
	}
	if mode&syscall.S_IFMT != 0 && mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, nil, 0, syscall.EPERM
	}
	if d.child(name) != nil {
		return nil, nil, 0, syscall.EEXIST
	}
	tmpl := d.template()
	if c, ok := fuse.FromContext(ctx); ok {
		tmpl.Owner = c.Uid
	}
	t, err := d.fsys.store.New(tmpl)
	if err != nil {
		return nil, nil, 0, toErrno(fmt.Sprintf("create %s", name), err)
	}
	f := &File{fsys: d.fsys, t: t}
	f.meta.init(ctx, mode)
	fh, fuseFlags, errno := f.Open(ctx, flags)
	if errno != 0 {
		t.Unlink()
		return nil, nil, 0, errno
	}
	in := d.NewPersistentInode(ctx, f, gofs.StableAttr{Mode: syscall.S_IFREG})
	d.mu.Lock()
	if d.entries[name] != nil {
		// Lost a race with another create of the name: the kernel holds the
		// directory lock for creates, so this is a safety net only.
		d.mu.Unlock()
		fh.(*handle).h.Close()
		t.Unlink()
		return nil, nil, 0, syscall.EEXIST
	}
	d.setEntry(name, in)
	d.mu.Unlock()
	var a fuse.AttrOut
	f.Getattr(ctx, fh, &a)
	out.Attr = a.Attr
	return in, fh, fuseFlags, 0
}
