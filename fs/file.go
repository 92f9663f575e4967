package fs

import (
	"context"
	"fmt"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/tensorfs/tensorfs/namespace"
	"github.com/tensorfs/tensorfs/tensor"
)

// File is a tensor file, the FUSE node of a namespace.File: its content is
// the tensor's device memory.
type File struct {
	gofs.Inode
	fsys *FS
	ns   *namespace.File
	t    *tensor.Tensor // ns's
	meta
	kernelHeld
}

// Invalidate implements namespace.Frontend: the kernel drops the
// attributes it caches for f (see Dir.Invalidate).
func (f *File) Invalidate() {
	f.NotifyContent(-1, 0)
}

// handle is an open file: it keeps the tensor alive after unlink and holds the
// opener's lease on the tensor's IPC export.
type handle struct {
	h *tensor.Handle
}

// Getattr implements gofs.NodeGetattrer. nlink is 0 once the name is gone.
// The kernel may keep the answer for attrTimeout: every change it does not
// make itself invalidates it (Invalidate, from tensor.OnAttrChange).
// The request shows that the kernel holds the inode (kernelHeld).
func (f *File) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f.held.Store(true)
	f.attrs(out)
	return 0
}

// attrs fills out with the file's attributes, cached for attrTimeout.
func (f *File) attrs(out *fuse.AttrOut) {
	out.SetTimeout(attrTimeout)
	f.meta.fill(&out.Attr)
	in := f.t.Info()
	out.Size = uint64(in.Size)
	out.Blocks = uint64(in.Capacity+511) / 512
	out.Nlink = 0
	if in.Linked {
		out.Nlink = 1
	}
}

// Open implements gofs.NodeOpener. Every open is direct I/O, so each read sees
// the device memory as it is now (another process may have written it).
func (f *File) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	holder := "fh"
	if c, ok := fuse.FromContext(ctx); ok {
		holder = fmt.Sprintf("fh pid %d", c.Pid)
	}
	h, err := f.t.Open(holder)
	if err != nil {
		return nil, 0, toErrno("open", err)
	}
	return &handle{h: h}, fuse.FOPEN_DIRECT_IO, 0
}

// Read implements gofs.NodeReader, straight from device memory into the reply.
func (f *File) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n, err := f.t.ReadAt(dest, off)
	if err != nil {
		return nil, toErrno("read", err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

// Write implements gofs.NodeWriter. The data is copied into device memory
// before returning (go-fuse reuses the buffer).
func (f *File) Write(ctx context.Context, fh gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	n, err := f.t.WriteAt(data, off)
	if err != nil {
		return 0, toErrno("write", err)
	}
	f.meta.Touch()
	return uint32(n), 0
}

// Release implements gofs.NodeReleaser: the last close of an unlinked tensor
// deregisters and frees it.
func (f *File) Release(ctx context.Context, fh gofs.FileHandle) syscall.Errno {
	if h, ok := fh.(*handle); ok {
		h.h.Close()
	}
	return 0
}

// Flush implements gofs.NodeFlusher; writes are already in device memory.
func (f *File) Flush(ctx context.Context, fh gofs.FileHandle) syscall.Errno { return 0 }

// Fsync implements gofs.NodeFsyncer; writes are already in device memory.
func (f *File) Fsync(ctx context.Context, fh gofs.FileHandle, flags uint32) syscall.Errno {
	return 0
}

// Statfs implements gofs.NodeStatfser.
func (f *File) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return f.fsys.statfs(out)
}
