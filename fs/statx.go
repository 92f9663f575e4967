package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// statx answers STATX from the node's Getattr: without it go-fuse answers
// ENOSYS and the kernel stops sending STATX for the life of the mount.
func statx(ctx context.Context, g gofs.NodeGetattrer, fh gofs.FileHandle, out *fuse.StatxOut) syscall.Errno {
	var a fuse.AttrOut
	if errno := g.Getattr(ctx, fh, &a); errno != 0 {
		return errno
	}
	sx := &out.Statx
	sx.Mask = unix.STATX_BASIC_STATS
	sx.Blksize = a.Blksize
	sx.Nlink = a.Nlink
	sx.Uid, sx.Gid = a.Uid, a.Gid
	sx.Mode = uint16(a.Mode)
	sx.Ino = a.Ino
	sx.Size = a.Size
	sx.Blocks = a.Blocks
	sx.Atime = fuse.SxTime{Sec: a.Atime, Nsec: a.Atimensec}
	sx.Mtime = fuse.SxTime{Sec: a.Mtime, Nsec: a.Mtimensec}
	sx.Ctime = fuse.SxTime{Sec: a.Ctime, Nsec: a.Ctimensec}
	return 0
}

// Statx implements gofs.NodeStatxer.
func (f *File) Statx(ctx context.Context, fh gofs.FileHandle, flags, mask uint32, out *fuse.StatxOut) syscall.Errno {
	return statx(ctx, f, fh, out)
}

// Statx implements gofs.NodeStatxer.
func (d *Dir) Statx(ctx context.Context, fh gofs.FileHandle, flags, mask uint32, out *fuse.StatxOut) syscall.Errno {
	return statx(ctx, d, fh, out)
}

// Fsync implements gofs.NodeFsyncer for directories (fsync of a directory
// after a rename, as atomic-save code does): entries are in memory, so there
// is nothing to flush; go-fuse's default would be ENOTSUP.
func (d *Dir) Fsync(ctx context.Context, fh gofs.FileHandle, flags uint32) syscall.Errno {
	return 0
}
