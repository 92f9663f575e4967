package gpu

import (
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/tensorfs/tensorfs/ipc"
	"golang.org/x/sys/unix"
)

var _ Importer = (*Host)(nil)

// Import implements Importer for "memfd:/proc/PID/fd/N" handles: it opens the
// memfd read-write (the kernel's /proc rules apply to the daemon; callers
// check the requesting process's rights first, see fs's register handler)
// and returns [off, off+n) of it, n == 0 meaning up to its current size.
// Errors: ErrHandle for another kind of handle, a malformed path, or a file
// that is not a memfd; the open's errno (ENOENT for a dead process or fd,
// EACCES) wrapped with ErrHandle; ErrInvalidSize for a range outside the
// memfd.
func (h *Host) Import(handle string, off, n int64) (Buffer, error) {
	mh, err := ipc.ParseHandle(handle)
	if err == nil && mh.Kind != ipc.KindMemfd {
		err = fmt.Errorf("a %s handle", mh.Kind)
	}
	if err != nil {
		return nil, fmt.Errorf("import on %s: want memfd:/proc/PID/fd/N: %v: %w", HostName, err, ErrHandle)
	}
	path := mh.Path()
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w: %w", path, err, ErrHandle)
	}
	return h.importFD(fd, off, n)
}

// ImportFile is Import for a memfd the caller has already opened (and checked
// the rights to): the buffer keeps its own duplicate of f's descriptor, so the
// caller still closes f. Errors: as Import.
func (h *Host) ImportFile(f *os.File, off, n int64) (Buffer, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup %s: %w", f.Name(), err)
	}
	return h.importFD(fd, off, n)
}

// importFD makes a buffer of [off, off+n) of the memfd fd, which it owns
// (closed on error).
//
// The memfd is mapped only when it carries F_SEAL_SHRINK (nobody can shrink
// it under the mapping, so no SIGBUS) and no write seal; otherwise it is
// accessed with pread/pwrite, and a short read or write is an error wrapping
// ErrGone. A mapping makes reads and copies memmoves; pread costs a syscall
// per call and a copy, which is the price of memory its owner can take away.
func (h *Host) importFD(fd int, off, n int64) (b Buffer, err error) {
	defer func() {
		if err != nil {
			unix.Close(fd)
		}
	}()
	target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return nil, fmt.Errorf("readlink fd %d: %v: %w", fd, err, ErrHandle)
	}
	// Checked on what was opened, so a swapped fd cannot slip through.
	if !strings.HasPrefix(target, "/memfd:") {
		return nil, fmt.Errorf("%q is not a memfd: %w", target, ErrHandle)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat %s: %w", target, err)
	}
	if n == 0 && off >= 0 {
		n = st.Size - off
	}
	if n <= 0 || int64(int(n)) != n {
		return nil, fmt.Errorf("import [%d, +%d) of %s (%d bytes): %w", off, n, target, st.Size, ErrInvalidSize)
	}
	if err := checkRange(st.Size, off, n); err != nil {
		return nil, fmt.Errorf("import %s: %w", target, err)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		seals = 0 // not sealable: treat as shrinkable
	}
	b0 := &importBuffer{dev: h, id: NewAllocID(), fd: fd, off: off, n: n}
	// A descriptor opened read-only (a peer daemon's export, which the
	// importer only reads) is mapped read-only, and writes through the
	// buffer are refused rather than faulting.
	prot := unix.PROT_READ | unix.PROT_WRITE
	if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err == nil && fl&unix.O_ACCMODE == unix.O_RDONLY {
		b0.ro, prot = true, unix.PROT_READ
	}
	if seals&unix.F_SEAL_SHRINK != 0 && seals&(unix.F_SEAL_WRITE|unix.F_SEAL_FUTURE_WRITE) == 0 {
		// mmap offsets are page-aligned: map from the page holding off.
		start := off / pageSize * pageSize
		m, err := unix.Mmap(fd, start, int(off-start+n), prot, unix.MAP_SHARED)
		if err != nil {
			return nil, fmt.Errorf("mmap %s: %w", target, err)
		}
		b0.mapping, b0.mem = m, m[off-start:]
		return b0, nil
	}
	// No mapping of the memory: reserve n bytes of inaccessible address space
	// (PROT_NONE, MAP_NORESERVE: no memory, no commit) so the buffer still
	// has an address range of its own for MR registration, one that no other
	// buffer of this process can overlap and that faults if ever touched.
	r, err := unix.Mmap(-1, 0, int(n), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("reserve %d bytes of address space for %s: %w", n, target, err)
	}
	b0.mapping = r
	return b0, nil
}

// importBuffer is [off, off+n) of a memfd another process owns. mem is the
// mapped range when the memfd cannot shrink, nil when it is read and
// written with pread/pwrite; mapping is what Free unmaps (the mapping, or the
// address-space reservation that stands for the range).
type importBuffer struct {
	dev *Host
	id  uint64
	off int64
	n   int64

	mu      sync.RWMutex // guards fd, mem and mapping against Free during I/O
	fd      int          // -1 once freed
	mem     []byte
	mapping []byte
	ro      bool // opened read-only: writes are refused
}

// errReadOnly: a write to an import opened read-only.
var errReadOnly = fmt.Errorf("write to a read-only import: %w", ErrHandle)

func (b *importBuffer) ID() uint64     { return b.id }
func (b *importBuffer) Offset() int64  { return b.off }
func (b *importBuffer) Device() Device { return b.dev }
func (b *importBuffer) Size() int64    { return b.n }

// Addr is the first byte of the mapped range, or of the PROT_NONE reservation
// that stands for an unmapped import; 0 once freed.
func (b *importBuffer) Addr() uintptr {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.fd < 0 {
		return 0
	}
	if b.mem != nil {
		return uintptrOf(b.mem)
	}
	return uintptrOf(b.mapping)
}

// Handle is the daemon's own fd of the memfd (the owner's fd number means
// nothing to other processes once the owner closes it; the daemon's stays
// valid while the tensor lives).
func (b *importBuffer) Handle() string {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return ipc.MemfdHandle(os.Getpid(), b.fd)
}

// ReadAt reads from the memfd; a read cut short by its owner shrinking it is
// an error wrapping ErrGone.
func (b *importBuffer) ReadAt(p []byte, off int64) (int, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.fd < 0 {
		return 0, ErrFreed
	}
	if err := checkRange(b.n, off, int64(len(p))); err != nil {
		return 0, err
	}
	if b.mem != nil {
		return move(p, b.mem[off:]), nil
	}
	return b.pio(p, off, false)
}

// WriteAt writes to the memfd. Unmapped, it first checks that the memfd still
// holds the range, so that a write does not grow back a memfd its owner
// shrank (a shrink racing the write itself can still be undone by it: the
// owner raced its own shared memory); a short write is an error wrapping
// ErrGone.
func (b *importBuffer) WriteAt(p []byte, off int64) (int, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.fd < 0 {
		return 0, ErrFreed
	}
	if b.ro {
		return 0, errReadOnly
	}
	if err := checkRange(b.n, off, int64(len(p))); err != nil {
		return 0, err
	}
	if b.mem != nil {
		return move(b.mem[off:], p), nil
	}
	return b.pio(p, off, true)
}

// pio preads or pwrites all of p at the buffer's offset off. b.mu is held.
func (b *importBuffer) pio(p []byte, off int64, write bool) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	at := b.off + off
	if write {
		var st unix.Stat_t
		if err := unix.Fstat(b.fd, &st); err != nil {
			return 0, fmt.Errorf("fstat imported memfd: %w", err)
		}
		if st.Size < at+int64(len(p)) {
			return 0, fmt.Errorf("write [%d, +%d) of an imported memfd now %d bytes: %w", at, len(p), st.Size, ErrGone)
		}
	}
	done := 0
	for done < len(p) {
		var m int
		var err error
		if write {
			m, err = unix.Pwrite(b.fd, p[done:], at+int64(done))
		} else {
			m, err = unix.Pread(b.fd, p[done:], at+int64(done))
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, fmt.Errorf("imported memfd at %d: %w", at+int64(done), err)
		}
		if m == 0 {
			return done, fmt.Errorf("imported memfd ends before %d (%d of %d bytes): %w", at+int64(len(p)), done, len(p), ErrGone)
		}
		done += m
	}
	return done, nil
}

// Zero writes n zero bytes at off.
func (b *importBuffer) Zero(off, n int64) error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.fd < 0 {
		return ErrFreed
	}
	if b.ro {
		return errReadOnly
	}
	if err := checkRange(b.n, off, n); err != nil {
		return err
	}
	if b.mem != nil {
		zero(b.mem[off : off+n])
		return nil
	}
	zeros := make([]byte, min(n, 1<<20))
	for done := int64(0); done < n; {
		m := min(n-done, int64(len(zeros)))
		if _, err := b.pio(zeros[:m], off+done, true); err != nil {
			return err
		}
		done += m
	}
	return nil
}

// CopyFrom implements DirectCopier from tensorfs's own host memory: one
// memmove or one pwrite straight from the source's mapping, no staging. Locks
// are taken host buffer first, import second, as in CopyTo (hostBuffer's own
// CopyFrom declines an import source before locking anything).
func (b *importBuffer) CopyFrom(dstOff int64, src Buffer, srcOff, n int64) (bool, error) {
	s, ok := src.(*hostBuffer)
	if !ok {
		return false, nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mem == nil {
		return true, ErrFreed
	}
	_, err := b.WriteAt(s.mem[srcOff:srcOff+n], dstOff)
	return true, err
}

// CopyTo implements DirectCopierTo into tensorfs's own host memory: one
// memmove or pread straight into the destination's mapping.
func (b *importBuffer) CopyTo(srcOff int64, dst Buffer, dstOff, n int64) (bool, error) {
	d, ok := dst.(*hostBuffer)
	if !ok {
		return false, nil
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.mem == nil {
		return true, ErrFreed
	}
	_, err := b.ReadAt(d.mem[dstOff:dstOff+n], srcOff)
	return true, err
}

func (b *importBuffer) rlockMem(write bool) ([]byte, error) {
	b.mu.RLock()
	var err error
	switch {
	case b.fd < 0:
		err = ErrFreed
	case write && b.ro:
		err = errReadOnly
	case b.mem == nil:
		err = errNotMapped
	default:
		return b.mem, nil
	}
	b.mu.RUnlock()
	return nil, err
}

func (b *importBuffer) runlockMem() { b.mu.RUnlock() }

// Free unmaps and closes the daemon's fd; the owner's memory is untouched.
func (b *importBuffer) Free() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fd < 0 {
		return ErrFreed
	}
	err := unix.Munmap(b.mapping)
	if cerr := unix.Close(b.fd); err == nil {
		err = cerr
	}
	b.fd, b.mem, b.mapping = -1, nil, nil
	return err
}
