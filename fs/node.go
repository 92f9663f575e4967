// Package fs is tensorfs's FUSE frontend: a go-fuse node tree of directories and
// tensor files over the FUSE-free tensor store. It translates FUSE operations to
// tensor.Store / tensor.Tensor calls and domain errors to errnos (errno.go), and
// keeps only what is filesystem-specific: names, modes, owners, times, ordinary
// user xattrs and directory templates.
package fs

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
)

// NameMax is the longest file name in bytes; longer ones are ENAMETOOLONG.
const NameMax = 255

// blockSize is the unit statfs and st_blocks report, in bytes.
const blockSize = 4096

// FS is the state every node of one mount shares.
type FS struct {
	store *tensor.Store
	root  *Dir
	// peers is the peer service (copies to other nodes, stats of copies).
	peers *transfer.Service
	// mnt is the mountpoint, for renames through the mount that inotify
	// watchers see; "" until mounted.
	mnt    string
	tmpSeq atomic.Uint64
}

// meta is what every node carries besides its content: permissions, owner,
// times and ordinary user xattrs.
type meta struct {
	mu                  sync.Mutex
	mode                uint32 // permission bits only
	uid, gid            uint32
	atime, mtime, ctime time.Time
	xattrs              map[string][]byte // ordinary "user." attributes (not user.tensorfs.)
}

// init sets a new node's metadata: mode, the caller's owner, times of now.
func (m *meta) init(ctx context.Context, mode uint32) {
	now := time.Now()
	m.mode, m.atime, m.mtime, m.ctime = mode&07777, now, now, now
	if c, ok := fuse.FromContext(ctx); ok {
		m.uid, m.gid = c.Uid, c.Gid
	}
}

// fill copies the metadata into a FUSE attribute; m.mu is not held.
func (m *meta) fill(a *fuse.Attr) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a.Mode = m.mode
	a.Uid, a.Gid = m.uid, m.gid
	a.SetTimes(&m.atime, &m.mtime, &m.ctime)
	a.Blksize = blockSize
}

// touch marks a content change (write, truncate).
func (m *meta) touch() {
	now := time.Now()
	m.mu.Lock()
	m.mtime, m.ctime = now, now
	m.mu.Unlock()
}

// setattr applies mode, owner and time changes from a SETATTR request. The
// kernel (default_permissions) has checked the caller may make them.
func (m *meta) setattr(in *fuse.SetAttrIn) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	if mode, ok := in.GetMode(); ok {
		m.mode = mode & 07777
	}
	if uid, ok := in.GetUID(); ok {
		m.uid = uid
	}
	if gid, ok := in.GetGID(); ok {
		m.gid = gid
	}
	if t, ok := in.GetATime(); ok {
		m.atime = t
	}
	if t, ok := in.GetMTime(); ok {
		m.mtime = t
	}
	m.ctime = now
}

// statfs reports the default device: total is its capacity for tensorfs, used
// the bytes tensorfs holds there.
func (f *FS) statfs(out *fuse.StatfsOut) syscall.Errno {
	mi := f.store.DefaultDevice().MemInfo()
	total := uint64(mi.Total) / blockSize
	used := (uint64(mi.Used) + blockSize - 1) / blockSize
	free := uint64(0)
	if total > used {
		free = total - used
	}
	out.Blocks, out.Bfree, out.Bavail = total, free, free
	out.Bsize, out.Frsize = blockSize, blockSize
	out.NameLen = NameMax
	st := f.store.Stats()
	out.Files = uint64(st.Tensors) + free
	out.Ffree = free
	return 0
}

// checkName enforces NameMax.
func checkName(name string) syscall.Errno {
	if len(name) > NameMax {
		return syscall.ENAMETOOLONG
	}
	return 0
}

// embedder is what both node kinds share for tree operations.
type embedder interface {
	gofs.InodeEmbedder
	nodeMeta() *meta
}
