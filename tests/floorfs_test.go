package tests

import (
	"context"
	"math/bits"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	tfs "github.com/tensorfs/tensorfs/fs"
)

// floorFS is the benchmarks' FUSE floor: the least a go-fuse filesystem can do
// to serve create, write, read, truncate and unlink, with file bytes kept in
// preallocated Go byte slices. It is mounted with tensorfs's own options (see
// mountFloor), so tensorfs's cost over it is what tensorfs itself adds.
type floorFS struct {
	gofs.Inode

	mu   sync.Mutex
	free map[int][][]byte // spare buffers by power-of-two size class
}

// floorFile is one file of floorFS; its content is data[:size].
type floorFile struct {
	gofs.Inode
	fsys *floorFS

	mu   sync.Mutex
	data []byte
	size int64
}

var (
	_ gofs.NodeLookuper  = (*floorFS)(nil)
	_ gofs.NodeCreater   = (*floorFS)(nil)
	_ gofs.NodeUnlinker  = (*floorFS)(nil)
	_ gofs.NodeGetattrer = (*floorFS)(nil)
	_ gofs.NodeOpener    = (*floorFile)(nil)
	_ gofs.NodeReader    = (*floorFile)(nil)
	_ gofs.NodeWriter    = (*floorFile)(nil)
	_ gofs.NodeSetattrer = (*floorFile)(nil)
	_ gofs.NodeGetattrer = (*floorFile)(nil)
	_ gofs.NodeFlusher   = (*floorFile)(nil)
)

// sizeClass is the power-of-two class that holds n bytes.
func sizeClass(n int64) int {
	if n <= 1 {
		return 0
	}
	return bits.Len64(uint64(n - 1))
}

// prealloc puts count buffers able to hold n bytes on the free list, so that
// files of up to n bytes never allocate while a benchmark is timed.
func (r *floorFS) prealloc(n int64, count int) {
	c := sizeClass(n)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.free == nil {
		r.free = map[int][][]byte{}
	}
	for i := 0; i < count; i++ {
		r.free[c] = append(r.free[c], make([]byte, 1<<c))
	}
}

// get returns a buffer of at least n bytes, from the free list when it can.
func (r *floorFS) get(n int64) []byte {
	c := sizeClass(n)
	r.mu.Lock()
	if l := r.free[c]; len(l) > 0 {
		b := l[len(l)-1]
		r.free[c] = l[:len(l)-1]
		r.mu.Unlock()
		return b
	}
	r.mu.Unlock()
	return make([]byte, 1<<c)
}

// put returns a buffer to the free list.
func (r *floorFS) put(b []byte) {
	if cap(b) == 0 {
		return
	}
	b = b[:cap(b)]
	r.mu.Lock()
	if r.free == nil {
		r.free = map[int][][]byte{}
	}
	c := sizeClass(int64(len(b)))
	r.free[c] = append(r.free[c], b)
	r.mu.Unlock()
}

// Getattr implements gofs.NodeGetattrer.
func (r *floorFS) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | 0o755
	out.Nlink = 2
	return 0
}

// Lookup implements gofs.NodeLookuper.
func (r *floorFS) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	c := r.GetChild(name)
	if c == nil {
		return nil, syscall.ENOENT
	}
	if f, ok := c.Operations().(*floorFile); ok {
		f.fill(&out.Attr)
	}
	return c, 0
}

// Create implements gofs.NodeCreater: an empty file, opened for direct I/O.
func (r *floorFS) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if r.GetChild(name) != nil {
		return nil, nil, 0, syscall.EEXIST
	}
	f := &floorFile{fsys: r}
	in := r.NewPersistentInode(ctx, f, gofs.StableAttr{Mode: syscall.S_IFREG})
	f.fill(&out.Attr)
	return in, nil, fuse.FOPEN_DIRECT_IO, 0
}

// Unlink implements gofs.NodeUnlinker; go-fuse drops the child on success. The
// buffer goes back to the free list at once: the benchmarks never use a file
// after unlinking it.
func (r *floorFS) Unlink(ctx context.Context, name string) syscall.Errno {
	c := r.GetChild(name)
	if c == nil {
		return syscall.ENOENT
	}
	if f, ok := c.Operations().(*floorFile); ok {
		f.mu.Lock()
		r.put(f.data)
		f.data, f.size = nil, 0
		f.mu.Unlock()
	}
	return 0
}

// fill sets a file's attributes.
func (f *floorFile) fill(a *fuse.Attr) {
	f.mu.Lock()
	a.Size = uint64(f.size)
	f.mu.Unlock()
	a.Mode = syscall.S_IFREG | 0o644
	a.Nlink = 1
}

// Getattr implements gofs.NodeGetattrer.
func (f *floorFile) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f.fill(&out.Attr)
	return 0
}

// Open implements gofs.NodeOpener: every open is direct I/O, as in tensorfs.
func (f *floorFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

// Flush implements gofs.NodeFlusher; there is nothing to flush.
func (f *floorFile) Flush(ctx context.Context, fh gofs.FileHandle) syscall.Errno { return 0 }

// resize makes the file n bytes long, zeroing bytes that become visible from
// zeroFrom (the caller overwrites the rest). f.mu is held.
func (f *floorFile) resize(n, zeroFrom int64) {
	if n > int64(len(f.data)) {
		nb := f.fsys.get(n)
		copy(nb, f.data[:f.size])
		f.fsys.put(f.data)
		f.data = nb
	}
	if n > f.size {
		clear(f.data[f.size:max(f.size, zeroFrom)])
	}
	f.size = n
}

// Setattr implements gofs.NodeSetattrer: only the size matters.
func (f *floorFile) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok {
		f.mu.Lock()
		f.resize(int64(sz), int64(sz))
		f.mu.Unlock()
	}
	f.fill(&out.Attr)
	return 0
}

// Read implements gofs.NodeReader.
func (f *floorFile) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if off >= f.size {
		return fuse.ReadResultData(nil), 0
	}
	n := copy(dest, f.data[off:f.size])
	return fuse.ReadResultData(dest[:n]), 0
}

// Write implements gofs.NodeWriter; the data is copied (go-fuse reuses it).
func (f *floorFile) Write(ctx context.Context, fh gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if end := off + int64(len(data)); end > f.size {
		f.resize(end, off)
	}
	return uint32(copy(f.data[off:], data)), 0
}

// mountFloor mounts a floorFS on a fresh directory with tensorfs's mount
// options (fs.Mount): attribute, entry and negative timeouts of 0, MaxWrite =
// fs.MaxWrite, default_permissions, direct I/O mmap allowed, MaxBackground 64,
// DirectMount as root. Its log goes nowhere. The FsName starts with
// "tensorfs" and the mountpoint is recorded in ours, so that TestMain's check
// for leftover mounts covers it; a cleanup unmounts it.
func mountFloor(tb testing.TB) (*floorFS, string) {
	tb.Helper()
	dir := tb.TempDir()
	ours.Store(dir, true) // TestMain's leftover check looks at our mounts
	root := &floorFS{}
	zero := time.Duration(0)
	opts := &gofs.Options{
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{
			FsName:            "tensorfs-floor",
			Name:              "floorfs",
			MaxWrite:          tfs.MaxWrite,
			DirectMount:       os.Geteuid() == 0,
			Options:           []string{"default_permissions"},
			ExtraCapabilities: fuse.CAP_DIRECT_IO_ALLOW_MMAP,
			MaxBackground:     64,
			DisableSplice:     true,
		},
	}
	srv, err := gofs.Mount(dir, root, opts)
	if err != nil {
		tb.Fatalf("mount floor filesystem: %v", err)
	}
	tb.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			syscall.Unmount(dir, syscall.MNT_DETACH)
			tb.Errorf("unmount floor filesystem %s: %v", dir, err)
		}
	})
	return root, dir
}
