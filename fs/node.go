package fs

import (
	"context"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/tensorfs/tensorfs/namespace"
)

// NameMax is the longest file name in bytes; longer ones are ENAMETOOLONG.
const NameMax = namespace.NameMax

// blockSize is the unit statfs and st_blocks report, in bytes.
const blockSize = 4096

// FS is the state every node of one mount shares.
type FS struct {
	tree *namespace.Tree
	root *Dir
}

// meta is a namespace node's metadata, with the FUSE conversions.
type meta struct{ *namespace.Meta }

// callerOwner is the uid and gid of the FUSE request of ctx (0, 0 without
// one).
func callerOwner(ctx context.Context) (uid, gid uint32) {
	if c, ok := fuse.FromContext(ctx); ok {
		return c.Uid, c.Gid
	}
	return 0, 0
}

// caller is the namespace's view of the FUSE request's caller; nil without
// one.
func caller(ctx context.Context) *namespace.Caller {
	if c, ok := fuse.FromContext(ctx); ok {
		return &namespace.Caller{UID: c.Uid, GID: c.Gid, PID: c.Pid}
	}
	return nil
}

// copyCtx is the context of a copy asked for by the FUSE request of ctx
// (see namespace.CopyContext).
func copyCtx(ctx context.Context) context.Context {
	return namespace.CopyContext(caller(ctx))
}

// fill copies the metadata into a FUSE attribute; its lock is not held.
func (m meta) fill(a *fuse.Attr) {
	m.Lock()
	defer m.Unlock()
	a.Mode = m.Mode
	a.Uid, a.Gid = m.UID, m.GID
	a.SetTimes(&m.Atime, &m.Mtime, &m.Ctime)
	a.Blksize = blockSize
}

// setattr applies mode, owner and time changes from a SETATTR request. The
// kernel (default_permissions) has checked the caller may make them.
func (m meta) setattr(in *fuse.SetAttrIn) {
	m.Lock()
	defer m.Unlock()
	if mode, ok := in.GetMode(); ok {
		m.Mode = mode & 07777
	}
	if uid, ok := in.GetUID(); ok {
		m.UID = uid
	}
	if gid, ok := in.GetGID(); ok {
		m.GID = gid
	}
	if t, ok := in.GetATime(); ok {
		m.Atime = t
	}
	if t, ok := in.GetMTime(); ok {
		m.Mtime = t
	}
	m.Ctime = time.Now()
}

// inode returns the go-fuse inode of namespace node n: its node wrapper's,
// made (a persistent inode, under parent) the first time the kernel is
// told of n.
func (f *FS) inode(ctx context.Context, parent *gofs.Inode, n namespace.Node) *gofs.Inode {
	fr := n.Front(func() namespace.Frontend {
		switch x := n.(type) {
		case *namespace.Dir:
			d := f.dirNode(x)
			parent.NewPersistentInode(ctx, d, gofs.StableAttr{Mode: syscall.S_IFDIR})
			return d
		case *namespace.File:
			fl := f.fileNode(x)
			parent.NewPersistentInode(ctx, fl, gofs.StableAttr{Mode: syscall.S_IFREG})
			return fl
		}
		return nil
	})
	return fr.(gofs.InodeEmbedder).EmbeddedInode()
}

// dirNode wraps a namespace directory (not yet given an inode).
func (f *FS) dirNode(d *namespace.Dir) *Dir {
	return &Dir{fsys: f, d: d, meta: meta{d.Meta()}}
}

// fileNode wraps a namespace file (not yet given an inode).
func (f *FS) fileNode(x *namespace.File) *File {
	return &File{fsys: f, ns: x, t: x.Tensor(), meta: meta{x.Meta()}}
}

// statfs reports the default device: total is its capacity for tensorfs, used
// the bytes tensorfs holds there.
func (f *FS) statfs(out *fuse.StatfsOut) syscall.Errno {
	store := f.tree.Store()
	mi := store.DefaultDevice().MemInfo()
	total := uint64(mi.Total) / blockSize
	used := (uint64(mi.Used) + blockSize - 1) / blockSize
	free := uint64(0)
	if total > used {
		free = total - used
	}
	out.Blocks, out.Bfree, out.Bavail = total, free, free
	out.Bsize, out.Frsize = blockSize, blockSize
	out.NameLen = NameMax
	st := store.Stats()
	out.Files = uint64(st.Tensors) + free
	out.Ffree = free
	return 0
}

// checkName enforces NameMax.
func checkName(name string) syscall.Errno { return namespace.CheckName(name) }
