package gpu

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// HostName is the device name of the host-memory backend.
const HostName = "host"

var nextAllocID atomic.Uint64

// NewAllocID returns a process-wide allocation id, starting at 1, never
// reused; every backend takes its ids here, so ids are unique across devices.
func NewAllocID() uint64 { return nextAllocID.Add(1) }

// Host is the host-memory backend: each buffer is a sealed memfd, committed with
// fallocate and mapped shared into the daemon, exported to other processes as
// memfd:/proc/PID/fd/N.
//
// Creating, committing, mapping and destroying a memfd costs about 80 µs per
// tensor, more than the rest of a create+unlink through FUSE (measured in
// bench/history.md), so freed small buffers are kept for reuse: sealed,
// mapped and paged in, per (size, owner) since a reused memfd keeps its
// handle, and only for a short while so idle memory goes back.
//
// Large freed buffers are kept too, for a little longer: touching fresh
// memory costs about 1 s a GiB on the VMs this runs on (page faults), so a
// copy that replaces a large tensor, or follows the removal of one, should
// land in memory that is already paged in. They are zeroed in the
// background after their free, so neither the free nor the next allocation
// pays for it. Kept memory is not "used" (stats' live bytes do not count
// it), but it is real memory: used plus kept never exceeds the cap, and an
// allocation that needs the room releases kept buffers first.
type Host struct {
	limit int64
	used  atomic.Int64

	spareMu    sync.Mutex
	spares     map[spareKey][]*spare
	spareBytes int64
	trimming   bool
	// closed: Close has released the spares; a buffer freed after it is
	// unmapped and closed at once, not kept by a device nobody will ask
	// again (its fd stayed open until the trim, after its caller was gone).
	closed bool
}

// Recycling bounds: buffers up to spareMaxSize bytes are kept, at most
// spareMaxBytes in all, each for at most spareTTL after its free. Larger
// ones are kept up to spareLargeMaxBytes in all (and a quarter of the cap),
// each for spareLargeTTL: long enough for the next copy of a series, short
// enough that an idle daemon holds no memory (and no memfd) within the few
// seconds the tests allow for fds to go back to their baseline.
const (
	spareMaxSize       = 2 << 20
	spareMaxBytes      = 64 << 20
	spareTTL           = 500 * time.Millisecond
	spareLargeMaxBytes = 8 << 30
	spareLargeTTL      = 2 * time.Second
)

type spareKey struct {
	n     int64
	owner uint32
}

type spare struct {
	fd    int
	mem   []byte
	freed time.Time
	// zeroed is closed once mem is all zeros (large spares are cleared in
	// the background after their free; small ones at reuse), or once the
	// background clear has stopped for a taker that set stop.
	zeroed chan struct{}
	stop   atomic.Bool
}

// zeroStep is the bytes the background clear of a large spare clears
// between looks at spare.stop.
const zeroStep = 4 << 20

func (sp *spare) large() bool { return int64(len(sp.mem)) > spareMaxSize }

func (sp *spare) ttl() time.Duration {
	if sp.large() {
		return spareLargeTTL
	}
	return spareTTL
}

// NewHost returns a host-memory device whose capacity is maxMemory bytes, or,
// when maxMemory is 0, the machine's available memory now (MemAvailable in
// /proc/meminfo). Errors: ErrInvalidSize for a negative maxMemory, or a failure
// to read /proc/meminfo.
func NewHost(maxMemory int64) (*Host, error) {
	if maxMemory < 0 {
		return nil, fmt.Errorf("max memory %d: %w", maxMemory, ErrInvalidSize)
	}
	avail, err := memAvailable()
	if err != nil {
		return nil, err
	}
	if maxMemory == 0 || maxMemory > avail {
		maxMemory = avail
	}
	return &Host{limit: maxMemory}, nil
}

// memAvailable reads MemAvailable (bytes) from /proc/meminfo.
func memAvailable() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/meminfo: %v", err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("/proc/meminfo: no MemAvailable line")
}

// Name implements Device.
func (h *Host) Name() string { return HostName }

// MemInfo implements Device.
func (h *Host) MemInfo() MemInfo { return MemInfo{Total: h.limit, Used: h.used.Load()} }

// Close implements Device: it releases the recycled buffers.
func (h *Host) Close() error {
	h.spareMu.Lock()
	all := h.spares
	h.spares, h.spareBytes, h.closed = nil, 0, true
	h.spareMu.Unlock()
	for _, l := range all {
		for _, sp := range l {
			sp.release()
		}
	}
	return nil
}

// release unmaps and closes a spare, once its background zeroing has stopped.
func (sp *spare) release() {
	if sp.zeroed != nil {
		sp.stop.Store(true) // no need to clear what is unmapped
		<-sp.zeroed
	}
	unix.Munmap(sp.mem)
	unix.Close(sp.fd)
}

// reserve accounts n bytes against the cap, or fails with ErrOutOfMemory.
func (h *Host) reserve(n int64) error {
	for {
		u := h.used.Load()
		if n > h.limit-u {
			return fmt.Errorf("%d bytes with %d of %d in use: %w", n, u, h.limit, ErrOutOfMemory)
		}
		if h.used.CompareAndSwap(u, u+n) {
			return nil
		}
	}
}

// pageSize is the unit the kernel commits memfd memory in.
var pageSize = int64(os.Getpagesize())

// committed is what an n-byte memfd really holds: whole pages. The cap,
// statfs and stats count this, so a thousand 1-byte tensors cost 4 MiB there
// as they do in the machine's memory.
func committed(n int64) int64 { return (n + pageSize - 1) / pageSize * pageSize }

// Alloc implements Device. Every host buffer is its own memfd, so owner needs
// no separation here (it keys the recycling of freed buffers).
func (h *Host) Alloc(nbytes int64, owner uint32) (Buffer, error) {
	return h.alloc(nbytes, owner, false)
}

// AllocUninit implements gpu.UninitAllocator: a recycled buffer of owner is
// handed out as it is (its background clear, if still running, is
// stopped); a new memfd is zero anyway.
func (h *Host) AllocUninit(nbytes int64, owner uint32) (Buffer, error) {
	return h.alloc(nbytes, owner, true)
}

func (h *Host) alloc(nbytes int64, owner uint32, uninit bool) (Buffer, error) {
	if nbytes <= 0 || int64(int(nbytes)) != nbytes || nbytes > 1<<62 {
		return nil, fmt.Errorf("host alloc of %d bytes: %w", nbytes, ErrInvalidSize)
	}
	if err := h.reserve(committed(nbytes)); err != nil {
		return nil, err
	}
	if b := h.reuse(nbytes, owner, uninit); b != nil {
		return b, nil
	}
	// New memory: kept buffers give up the room it needs under the cap.
	h.shrinkSpares(h.limit - h.used.Load())
	b, err := newHostBuffer(h, nbytes, owner)
	if err != nil {
		h.used.Add(-committed(nbytes))
		return nil, err
	}
	return b, nil
}

// reuse returns a recycled buffer of exactly n bytes of owner, or nil:
// zeroed, or as its last owner left it when uninit.
func (h *Host) reuse(n int64, owner uint32, uninit bool) *hostBuffer {
	k := spareKey{n, owner}
	h.spareMu.Lock()
	l := h.spares[k]
	if len(l) == 0 {
		h.spareMu.Unlock()
		return nil
	}
	sp := l[len(l)-1]
	h.spares[k] = l[:len(l)-1]
	h.spareBytes -= committed(n)
	h.spareMu.Unlock()
	switch {
	case sp.zeroed != nil:
		if uninit {
			sp.stop.Store(true)
		}
		<-sp.zeroed
	case !uninit:
		zero(sp.mem)
	}
	return &hostBuffer{dev: h, id: NewAllocID(), fd: sp.fd, mem: sp.mem, owner: owner}
}

// shrinkSpares releases kept buffers, oldest first, until they hold at most
// room bytes.
func (h *Host) shrinkSpares(room int64) {
	h.spareMu.Lock()
	var drop []*spare
	for h.spareBytes > max(room, 0) {
		var oldest *spare
		var ok spareKey
		for k, l := range h.spares {
			if len(l) > 0 && (oldest == nil || l[0].freed.Before(oldest.freed)) {
				oldest, ok = l[0], k
			}
		}
		if oldest == nil {
			break
		}
		h.spares[ok] = h.spares[ok][1:]
		if len(h.spares[ok]) == 0 {
			delete(h.spares, ok)
		}
		h.spareBytes -= committed(ok.n)
		drop = append(drop, oldest)
	}
	h.spareMu.Unlock()
	for _, sp := range drop {
		sp.release()
	}
}

// keep takes a freed buffer's memory for reuse; false when it is not worth
// keeping (too large, or the pool is full).
//
// Small and large spares share spareBytes: the large bound (its own, a
// quarter of the cap, and the cap less what is in use) applies to the sum,
// the small one to the sum while it holds no large spare, so small spares
// never crowd out large ones past spareMaxBytes.
func (h *Host) keep(fd int, mem []byte, owner uint32) bool {
	n := int64(len(mem))
	sp := &spare{fd: fd, mem: mem, freed: time.Now()}
	h.spareMu.Lock()
	defer h.spareMu.Unlock()
	if h.closed {
		return false
	}
	bound := int64(spareMaxBytes)
	if sp.large() {
		bound = min(spareLargeMaxBytes, h.limit/4, h.limit-h.used.Load())
	}
	if h.spareBytes+committed(n) > bound {
		return false
	}
	if h.spares == nil {
		h.spares = map[spareKey][]*spare{}
	}
	if sp.large() {
		sp.zeroed = make(chan struct{})
		go func() {
			defer close(sp.zeroed)
			for off := 0; off < len(sp.mem) && !sp.stop.Load(); off += zeroStep {
				clear(sp.mem[off:min(off+zeroStep, len(sp.mem))])
			}
		}()
	}
	k := spareKey{n, owner}
	h.spares[k] = append(h.spares[k], sp)
	h.spareBytes += committed(n)
	if !h.trimming {
		h.trimming = true
		time.AfterFunc(spareTTL, h.trim)
	}
	return true
}

// trim releases spares older than spareTTL, and runs again while any remain.
func (h *Host) trim() {
	h.spareMu.Lock()
	var drop []*spare
	now := time.Now()
	for k, l := range h.spares {
		kept := l[:0]
		for _, sp := range l {
			if now.Sub(sp.freed) >= sp.ttl() {
				drop = append(drop, sp)
				h.spareBytes -= committed(k.n)
			} else {
				kept = append(kept, sp)
			}
		}
		if len(kept) == 0 {
			delete(h.spares, k)
		} else {
			h.spares[k] = kept
		}
	}
	h.trimming = len(h.spares) > 0
	if h.trimming {
		time.AfterFunc(spareTTL, h.trim)
	}
	h.spareMu.Unlock()
	for _, sp := range drop {
		sp.release()
	}
}

func newHostBuffer(h *Host, nbytes int64, owner uint32) (*hostBuffer, error) {
	fd, err := unix.MemfdCreate("tensorfs", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err == unix.EMFILE || err == unix.ENFILE {
		// Each host tensor holds a file descriptor: running out is running
		// out of room for tensors (ENOSPC), not the caller's EMFILE.
		return nil, fmt.Errorf("memfd_create: %v (one fd per tensor; raise the daemon's RLIMIT_NOFILE): %w", err, ErrOutOfMemory)
	}
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	fail := func(op string, err error) (*hostBuffer, error) {
		unix.Close(fd)
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENOMEM) {
			return nil, fmt.Errorf("%s %d bytes: %v: %w", op, nbytes, err, ErrOutOfMemory)
		}
		return nil, fmt.Errorf("%s %d bytes: %w", op, nbytes, err)
	}
	if err := unix.Ftruncate(fd, nbytes); err != nil {
		return fail("ftruncate", err)
	}
	// Commit now: running out must be an errno here, never a SIGBUS on first touch.
	if err := unix.Fallocate(fd, 0, 0, nbytes); err != nil {
		return fail("fallocate", err)
	}
	// Other processes open /proc/PID/fd/N; sealing the size means none of them
	// can shrink the memfd under the daemon's mapping (which would be a SIGBUS).
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail("seal", err)
	}
	mem, err := unix.Mmap(fd, 0, int(nbytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap", err)
	}
	return &hostBuffer{dev: h, id: NewAllocID(), fd: fd, mem: mem, owner: owner}, nil
}

type hostBuffer struct {
	dev   *Host
	id    uint64
	fd    int
	owner uint32

	mu  sync.RWMutex // guards mem against Free during I/O
	mem []byte
}

func (b *hostBuffer) ID() uint64     { return b.id }
func (b *hostBuffer) Offset() int64  { return 0 }
func (b *hostBuffer) Device() Device { return b.dev }
func (b *hostBuffer) Size() int64 {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return int64(len(b.mem))
}

func (b *hostBuffer) Addr() uintptr {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if len(b.mem) == 0 {
		return 0
	}
	return uintptrOf(b.mem)
}

func (b *hostBuffer) Handle() string {
	return fmt.Sprintf("memfd:/proc/%d/fd/%d", os.Getpid(), b.fd)
}

func (b *hostBuffer) ReadAt(p []byte, off int64) (int, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.mem == nil {
		return 0, ErrFreed
	}
	if err := checkRange(int64(len(b.mem)), off, int64(len(p))); err != nil {
		return 0, err
	}
	return move(p, b.mem[off:]), nil
}

func (b *hostBuffer) WriteAt(p []byte, off int64) (int, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.mem == nil {
		return 0, ErrFreed
	}
	if err := checkRange(int64(len(b.mem)), off, int64(len(p))); err != nil {
		return 0, err
	}
	return move(b.mem[off:], p), nil
}

func (b *hostBuffer) Zero(off, n int64) error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.mem == nil {
		return ErrFreed
	}
	if err := checkRange(int64(len(b.mem)), off, n); err != nil {
		return err
	}
	zero(b.mem[off : off+n])
	return nil
}

// CopyFrom implements DirectCopier: host to host is one memmove, no staging.
func (b *hostBuffer) CopyFrom(dstOff int64, src Buffer, srcOff, n int64) (bool, error) {
	s, ok := src.(*hostBuffer)
	if !ok {
		return false, nil
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if s != b {
		s.mu.RLock()
		defer s.mu.RUnlock()
	}
	if b.mem == nil || s.mem == nil {
		return true, ErrFreed
	}
	move(b.mem[dstOff:dstOff+n], s.mem[srcOff:srcOff+n])
	return true, nil
}

func (b *hostBuffer) rlockMem(bool) ([]byte, error) {
	b.mu.RLock()
	if b.mem == nil {
		b.mu.RUnlock()
		return nil, ErrFreed
	}
	return b.mem, nil
}

func (b *hostBuffer) runlockMem() { b.mu.RUnlock() }

func (b *hostBuffer) Free() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mem == nil {
		return ErrFreed
	}
	n := int64(len(b.mem))
	b.dev.used.Add(-committed(n))
	if b.dev.keep(b.fd, b.mem, b.owner) {
		b.mem = nil
		return nil
	}
	err := unix.Munmap(b.mem)
	b.mem = nil
	if cerr := unix.Close(b.fd); err == nil {
		err = cerr
	}
	return err
}

// InPlace runs fn on bytes [off, off+n) of b when b is host memory mapped
// into this process, holding b against Free until fn returns: a copy can then
// receive from a socket straight into the buffer. ok is false (fn not run)
// for any other buffer. Errors: ErrFreed, a range outside b (checkRange's),
// or fn's.
func InPlace(b Buffer, off, n int64, fn func(p []byte) error) (ok bool, err error) {
	hb, isHost := b.(*hostBuffer)
	if !isHost {
		return false, nil
	}
	hb.mu.RLock()
	defer hb.mu.RUnlock()
	if hb.mem == nil {
		return true, ErrFreed
	}
	if err := checkRange(int64(len(hb.mem)), off, n); err != nil {
		return true, err
	}
	return true, fn(hb.mem[off : off+n])
}
