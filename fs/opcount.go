package fs

import (
	"strconv"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The FUSE operations counted by OpCounts, in the order of OpNames.
const (
	opLookup = iota
	opForget
	opGetattr
	opSetattr
	opMknod
	opMkdir
	opUnlink
	opRmdir
	opRename
	opLink
	opSymlink
	opReadlink
	opAccess
	opGetxattr
	opListxattr
	opSetxattr
	opRemovexattr
	opCreate
	opTmpfile
	opOpen
	opRead
	opLseek
	opGetlk
	opSetlk
	opSetlkw
	opRelease
	opWrite
	opCopyFileRange
	opIoctl
	opFlush
	opFsync
	opFallocate
	opOpendir
	opReaddir
	opReaddirplus
	opReleasedir
	opFsyncdir
	opStatfs
	opStatx
	numOps
)

// OpNames are the names of the counted FUSE operations (the kernel's
// opcodes, lower case: "getxattr", "setxattr", "read", ...), indexed like
// OpCounts' counters.
var OpNames = [numOps]string{
	opLookup: "lookup", opForget: "forget", opGetattr: "getattr", opSetattr: "setattr",
	opMknod: "mknod", opMkdir: "mkdir", opUnlink: "unlink", opRmdir: "rmdir", opRename: "rename",
	opLink: "link", opSymlink: "symlink", opReadlink: "readlink", opAccess: "access",
	opGetxattr: "getxattr", opListxattr: "listxattr", opSetxattr: "setxattr", opRemovexattr: "removexattr",
	opCreate: "create", opTmpfile: "tmpfile", opOpen: "open", opRead: "read", opLseek: "lseek",
	opGetlk: "getlk", opSetlk: "setlk", opSetlkw: "setlkw", opRelease: "release", opWrite: "write",
	opCopyFileRange: "copy_file_range", opIoctl: "ioctl", opFlush: "flush", opFsync: "fsync",
	opFallocate: "fallocate", opOpendir: "opendir", opReaddir: "readdir", opReaddirplus: "readdirplus",
	opReleasedir: "releasedir", opFsyncdir: "fsyncdir", opStatfs: "statfs", opStatx: "statx",
}

// maxErrno bounds the errnos counted one by one (Linux's go up to 133);
// a larger status, which no handler gives, counts under 0.
const maxErrno = 256

// OpCounts counts the FUSE requests a mount answered, by operation, and
// those answered with an errno, by operation and errno. It is the one place
// that sees every request and every reply's status: it wraps go-fuse's raw
// file system (Options.Counts), below the node handlers, so a handler
// needs no counting of its own and none can be missed. Counting is an
// atomic add per request (and one more per error), no allocation; a mount
// without Options.Counts pays nothing. Safe for concurrent use; the zero
// value is ready.
type OpCounts struct {
	ops    [numOps]atomic.Int64
	errnos [numOps][maxErrno]atomic.Int64
}

// OpCount is one operation's counts (OpCounts.Each).
type OpCount struct {
	// Op is the operation's name (OpNames).
	Op string
	// Requests counts the requests answered, successful or not.
	Requests int64
	// Errors counts, by errno name ("EINVAL", "ENOENT"; unix.ErrnoName),
	// the requests answered with that errno; nil when there were none.
	Errors map[string]int64
}

// Snapshot returns the counts now, for the operations that have had at
// least one request, in OpNames' order.
func (c *OpCounts) Snapshot() []OpCount {
	var out []OpCount
	for op := range c.ops {
		n := c.ops[op].Load()
		if n == 0 {
			continue
		}
		oc := OpCount{Op: OpNames[op], Requests: n}
		for e := range c.errnos[op] {
			if k := c.errnos[op][e].Load(); k != 0 {
				if oc.Errors == nil {
					oc.Errors = map[string]int64{}
				}
				oc.Errors[errnoName(syscall.Errno(e))] += k
			}
		}
		out = append(out, oc)
	}
	return out
}

// errnoName is the errno's symbolic name ("EINVAL"), or "errno N" for one
// unix does not name.
func errnoName(e syscall.Errno) string {
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return "errno " + strconv.Itoa(int(e))
}

// count records one request of op answered with st, and returns st.
func (c *OpCounts) count(op int, st fuse.Status) fuse.Status {
	c.ops[op].Add(1)
	if st != fuse.OK {
		e := int(st)
		if e < 0 || e >= maxErrno {
			e = 0
		}
		c.errnos[op][e].Add(1)
	}
	return st
}

// countingFS is a fuse.RawFileSystem that counts each request in c and
// hands it to the node file system underneath.
type countingFS struct {
	fuse.RawFileSystem
	c *OpCounts
}

func (f *countingFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	return f.c.count(opLookup, f.RawFileSystem.Lookup(cancel, h, name, out))
}

func (f *countingFS) Forget(nodeid, nlookup uint64) {
	f.c.count(opForget, fuse.OK)
	f.RawFileSystem.Forget(nodeid, nlookup)
}

func (f *countingFS) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	return f.c.count(opGetattr, f.RawFileSystem.GetAttr(cancel, in, out))
}

func (f *countingFS) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	return f.c.count(opSetattr, f.RawFileSystem.SetAttr(cancel, in, out))
}

func (f *countingFS) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	return f.c.count(opMknod, f.RawFileSystem.Mknod(cancel, in, name, out))
}

func (f *countingFS) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	return f.c.count(opMkdir, f.RawFileSystem.Mkdir(cancel, in, name, out))
}

func (f *countingFS) Unlink(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return f.c.count(opUnlink, f.RawFileSystem.Unlink(cancel, h, name))
}

func (f *countingFS) Rmdir(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return f.c.count(opRmdir, f.RawFileSystem.Rmdir(cancel, h, name))
}

func (f *countingFS) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	return f.c.count(opRename, f.RawFileSystem.Rename(cancel, in, oldName, newName))
}

func (f *countingFS) Link(cancel <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	return f.c.count(opLink, f.RawFileSystem.Link(cancel, in, name, out))
}

func (f *countingFS) Symlink(cancel <-chan struct{}, h *fuse.InHeader, to, name string, out *fuse.EntryOut) fuse.Status {
	return f.c.count(opSymlink, f.RawFileSystem.Symlink(cancel, h, to, name, out))
}

func (f *countingFS) Readlink(cancel <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	b, st := f.RawFileSystem.Readlink(cancel, h)
	return b, f.c.count(opReadlink, st)
}

func (f *countingFS) Access(cancel <-chan struct{}, in *fuse.AccessIn) fuse.Status {
	return f.c.count(opAccess, f.RawFileSystem.Access(cancel, in))
}

func (f *countingFS) GetXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	n, st := f.RawFileSystem.GetXAttr(cancel, h, attr, dest)
	return n, f.c.count(opGetxattr, st)
}

func (f *countingFS) ListXAttr(cancel <-chan struct{}, h *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	n, st := f.RawFileSystem.ListXAttr(cancel, h, dest)
	return n, f.c.count(opListxattr, st)
}

func (f *countingFS) SetXAttr(cancel <-chan struct{}, in *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	return f.c.count(opSetxattr, f.RawFileSystem.SetXAttr(cancel, in, attr, data))
}

func (f *countingFS) RemoveXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string) fuse.Status {
	return f.c.count(opRemovexattr, f.RawFileSystem.RemoveXAttr(cancel, h, attr))
}

func (f *countingFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	return f.c.count(opCreate, f.RawFileSystem.Create(cancel, in, name, out))
}

func (f *countingFS) Tmpfile(cancel <-chan struct{}, in *fuse.CreateIn, out *fuse.CreateOut) fuse.Status {
	return f.c.count(opTmpfile, f.RawFileSystem.Tmpfile(cancel, in, out))
}

func (f *countingFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	return f.c.count(opOpen, f.RawFileSystem.Open(cancel, in, out))
}

func (f *countingFS) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	r, st := f.RawFileSystem.Read(cancel, in, buf)
	return r, f.c.count(opRead, st)
}

func (f *countingFS) Lseek(cancel <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) fuse.Status {
	return f.c.count(opLseek, f.RawFileSystem.Lseek(cancel, in, out))
}

func (f *countingFS) GetLk(cancel <-chan struct{}, in *fuse.LkIn, out *fuse.LkOut) fuse.Status {
	return f.c.count(opGetlk, f.RawFileSystem.GetLk(cancel, in, out))
}

func (f *countingFS) SetLk(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	return f.c.count(opSetlk, f.RawFileSystem.SetLk(cancel, in))
}

func (f *countingFS) SetLkw(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	return f.c.count(opSetlkw, f.RawFileSystem.SetLkw(cancel, in))
}

func (f *countingFS) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	f.c.count(opRelease, fuse.OK)
	f.RawFileSystem.Release(cancel, in)
}

func (f *countingFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	n, st := f.RawFileSystem.Write(cancel, in, data)
	return n, f.c.count(opWrite, st)
}

// Writev is the Write of a request whose data arrived in pieces: counted
// as a write, which is what the caller did.
func (f *countingFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	n, st := f.RawFileSystem.Writev(cancel, in, data)
	return n, f.c.count(opWrite, st)
}

func (f *countingFS) CopyFileRange(cancel <-chan struct{}, in *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	n, st := f.RawFileSystem.CopyFileRange(cancel, in)
	return n, f.c.count(opCopyFileRange, st)
}

func (f *countingFS) Ioctl(cancel <-chan struct{}, in *fuse.IoctlIn, inbuf []byte, out *fuse.IoctlOut, outbuf []byte) fuse.Status {
	return f.c.count(opIoctl, f.RawFileSystem.Ioctl(cancel, in, inbuf, out, outbuf))
}

func (f *countingFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	return f.c.count(opFlush, f.RawFileSystem.Flush(cancel, in))
}

func (f *countingFS) Fsync(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return f.c.count(opFsync, f.RawFileSystem.Fsync(cancel, in))
}

func (f *countingFS) Fallocate(cancel <-chan struct{}, in *fuse.FallocateIn) fuse.Status {
	return f.c.count(opFallocate, f.RawFileSystem.Fallocate(cancel, in))
}

func (f *countingFS) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	return f.c.count(opOpendir, f.RawFileSystem.OpenDir(cancel, in, out))
}

func (f *countingFS) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return f.c.count(opReaddir, f.RawFileSystem.ReadDir(cancel, in, out))
}

func (f *countingFS) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return f.c.count(opReaddirplus, f.RawFileSystem.ReadDirPlus(cancel, in, out))
}

func (f *countingFS) ReleaseDir(in *fuse.ReleaseIn) {
	f.c.count(opReleasedir, fuse.OK)
	f.RawFileSystem.ReleaseDir(in)
}

func (f *countingFS) FsyncDir(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return f.c.count(opFsyncdir, f.RawFileSystem.FsyncDir(cancel, in))
}

func (f *countingFS) StatFs(cancel <-chan struct{}, in *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	return f.c.count(opStatfs, f.RawFileSystem.StatFs(cancel, in, out))
}

func (f *countingFS) Statx(cancel <-chan struct{}, in *fuse.StatxIn, out *fuse.StatxOut) fuse.Status {
	return f.c.count(opStatx, f.RawFileSystem.Statx(cancel, in, out))
}

// Every operation of the raw interface that carries a request is counted
// above; the rest (String, SetDebug, Init, OnUnmount) pass through.
var _ fuse.RawFileSystem = (*countingFS)(nil)
