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

	"golang.org/x/sys/unix"
)

// HostName is the device name of the host-memory backend.
const HostName = "host"

var nextAllocID atomic.Uint64

// newAllocID returns a process-wide allocation id, starting at 1, never reused.
func newAllocID() uint64 { return nextAllocID.Add(1) }

// Host is the host-memory backend: each buffer is a sealed memfd, committed with
// fallocate and mapped shared into the daemon, exported to other processes as
// memfd:/proc/PID/fd/N.
type Host struct {
	limit int64
	used  atomic.Int64
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

// Close implements Device; the host device holds nothing of its own.
func (h *Host) Close() error { return nil }

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

// Alloc implements Device. Every host buffer is its own memfd, so owner needs
// no separation here.
func (h *Host) Alloc(nbytes int64, owner uint32) (Buffer, error) {
	if nbytes <= 0 || int64(int(nbytes)) != nbytes {
		return nil, fmt.Errorf("host alloc of %d bytes: %w", nbytes, ErrInvalidSize)
	}
	if err := h.reserve(nbytes); err != nil {
		return nil, err
	}
	b, err := newHostBuffer(h, nbytes)
	if err != nil {
		h.used.Add(-nbytes)
		return nil, err
	}
	return b, nil
}

func newHostBuffer(h *Host, nbytes int64) (*hostBuffer, error) {
	fd, err := unix.MemfdCreate("tensorfs", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
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
	return &hostBuffer{dev: h, id: newAllocID(), fd: fd, mem: mem}, nil
}

type hostBuffer struct {
	dev *Host
	id  uint64
	fd  int

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
	return copy(p, b.mem[off:]), nil
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
	return copy(b.mem[off:], p), nil
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
	clear(b.mem[off : off+n])
	return nil
}

// copyFrom is the host-to-host direct path: one memmove, no staging.
func (b *hostBuffer) copyFrom(dstOff int64, src Buffer, srcOff, n int64) (bool, error) {
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
	copy(b.mem[dstOff:dstOff+n], s.mem[srcOff:srcOff+n])
	return true, nil
}

func (b *hostBuffer) Free() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mem == nil {
		return ErrFreed
	}
	n := int64(len(b.mem))
	err := unix.Munmap(b.mem)
	b.mem = nil
	if cerr := unix.Close(b.fd); err == nil {
		err = cerr
	}
	b.dev.used.Add(-n)
	return err
}
