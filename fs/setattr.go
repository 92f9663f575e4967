package fs

import (
	"context"
	"math"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Setattr implements gofs.NodeSetattrer: a size change (truncate, ftruncate,
// O_TRUNC) sizes the tensor, allocating exactly that many bytes when it must
// grow its allocation; mode, owner and times are metadata.
func (f *File) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok {
		if sz > math.MaxInt64 {
			return syscall.EFBIG
		}
		if err := f.t.Truncate(int64(sz)); err != nil {
			return toErrno("truncate", err)
		}
		f.meta.Touch()
	}
	if uid, ok := in.GetUID(); ok {
		f.t.SetOwner(uid) // its memory is now uid's (see Tensor.SetOwner)
	}
	f.meta.setattr(in)
	return f.Getattr(ctx, fh, out)
}

// fallocKeepSize is FALLOC_FL_KEEP_SIZE from linux/falloc.h.
const fallocKeepSize = 1

// Allocate implements gofs.NodeAllocater (fallocate): mode 0 and
// FALLOC_FL_KEEP_SIZE allocate exactly up to off+size; other modes (punch
// hole, collapse, zero range) are EOPNOTSUPP.
func (f *File) Allocate(ctx context.Context, fh gofs.FileHandle, off uint64, size uint64, mode uint32) syscall.Errno {
	if mode&^fallocKeepSize != 0 {
		return syscall.EOPNOTSUPP
	}
	if off > math.MaxInt64 || size > math.MaxInt64 {
		return syscall.EFBIG
	}
	if err := f.t.Allocate(int64(off), int64(size), mode&fallocKeepSize != 0); err != nil {
		return toErrno("fallocate", err)
	}
	f.meta.Touch()
	return 0
}
