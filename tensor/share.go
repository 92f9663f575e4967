package tensor

import (
	"fmt"
	"log/slog"
	"unsafe"

	"github.com/tensorfs/tensorfs/gpu"
	"github.com/tensorfs/tensorfs/ipc"
)

// What moves into a tensor from elsewhere (adoption and copies), manual
// registration, and pins of its IPC export for peers.

// Adopt makes src's data t's: t takes src's allocation, dtype, shape and size
// (a new registration for t: its old allocation is retired, its generation
// bumps, its open handles move their leases), and src is left empty. It is how
// a copy replaces a tensor whose name cannot be renamed over (copy_from on
// the file whose xattr is being set): readers see the old bytes or the new,
// never a mix. Errors: ErrReleased when either tensor is released, ErrInvalid
// for t == src.
func (t *Tensor) Adopt(src *Tensor) error {
	defer t.flushAttrs(t.attrGen.Load())
	if t == src {
		return fmt.Errorf("adopt itself: %w", ErrInvalid)
	}
	first, second := t, src
	if uintptr(unsafe.Pointer(first)) > uintptr(unsafe.Pointer(second)) {
		first, second = second, first
	}
	for {
		first.mu.Lock()
		second.mu.Lock()
		if t.resizable() {
			break
		}
		// A copy reads or writes t: wait for it without holding src.
		second.mu.Unlock()
		first.mu.Unlock()
		t.lockToResize()
		t.mu.Unlock()
	}
	if t.released || src.released {
		second.mu.Unlock()
		first.mu.Unlock()
		return ErrReleased
	}
	old := t.alloc
	t.alloc, src.alloc = src.alloc, nil
	t.dtype, t.shape, t.size = src.dtype, src.shape, src.size
	t.attrsChanged()
	src.size, src.shape = 0, nil
	if old != nil || t.gen > 0 {
		t.gen++
	}
	t.device = src.device
	t.noteOwner()
	for h := range t.handles {
		h.relase(t)
	}
	for h := range src.handles {
		h.dropLease()
	}
	second.mu.Unlock()
	first.mu.Unlock()
	t.s.retire(old)
	return nil
}

// ExportPin is a tensor's export, pinned for one copy by a peer daemon of
// this host.
type ExportPin struct {
	// Handle opens the whole allocation ("memfd:/proc/PID/fd/N", "cuda:" +
	// 128 hex digits); Offset is the tensor's first byte in it.
	Handle string
	Offset int64
	// AllocID is the allocation's never-reused id (gpu.Buffer.ID); ExportID
	// and Generation are the tensor's ipc_id and generation now.
	AllocID, ExportID, Generation uint64
	// Release ends the pin (and the copy's lease).
	Release func()
	// Lease, when asked for, is a lease for the importer that outlives the
	// copy (its cached import); nil otherwise. Its holder releases it.
	Lease *ipc.Lease
}

// Register makes the tensor a view of buf, memory another process owns
// (imported with Store.Import or Store.ImportFile): buf is registered as a new
// memory region and exported (its own Handle and Offset), the tensor's size
// becomes buf.Size() with its dtype kept when it divides that size (else U8)
// and a 1-D shape, and its device becomes buf's. Register takes buf: on error
// it is freed (which only unmaps), and at release it is deregistered and
// freed the same way, never the owner's memory.
//
// A tensor that has an allocation is replaced (the old allocation retired,
// the generation bumped) only when it has no importers: no open file handle
// (each holds, or will hold, a lease; copies in flight hold one too) and no
// lease on its IPC export (peer daemons). Otherwise ErrBusy and nothing
// changes. Errors: ErrBusy, ErrReleased, ErrTooLarge for a size past MaxSize,
// mr.ErrOverlap.
func (t *Tensor) Register(buf gpu.Buffer) error {
	defer t.flushAttrs(t.attrGen.Load())
	n := buf.Size()
	fail := func(err error) error {
		if ferr := buf.Free(); ferr != nil {
			slog.Error("register: free import failed", "alloc", buf.ID(), "err", ferr)
		}
		return err
	}
	if n > MaxSize {
		return fail(fmt.Errorf("register %d bytes: %w", n, ErrTooLarge))
	}
	t.mu.Lock()
	if t.released {
		t.mu.Unlock()
		return fail(ErrReleased)
	}
	old := t.alloc
	if old != nil {
		leases, _ := t.s.IPC.Leases(old.export.ID)
		if handles := len(t.handles); handles > 0 || leases > 0 {
			t.mu.Unlock()
			return fail(fmt.Errorf("register over an allocation with %d open handles and %d leases: %w", handles, leases, ErrBusy))
		}
	}
	dev := buf.Device().Name()
	// Shared: another file may register the same foreign memory (CUDA maps
	// a handle once per process, so both get one address range).
	region, err := t.s.MRs.RegisterShared(dev, buf.Addr(), uint64(n))
	if err != nil {
		t.mu.Unlock()
		return fail(fmt.Errorf("register %d bytes on %s: %w", n, dev, err))
	}
	exp := t.s.IPC.Export(buf.Handle(), buf.ID(), buf.Offset(), n)
	t.alloc = &allocation{buf: buf, region: region, export: exp, foreign: true}
	t.attrsChanged()
	if old != nil {
		t.gen++
	}
	t.device, t.size = dev, n
	t.dtype, t.shape = fitShape(t.dtype, nil, n)
	for h := range t.handles {
		h.relase(t)
	}
	t.mu.Unlock()
	t.s.retire(old)
	return nil
}

// Registered reports whether the tensor is backed by memory registered with
// Register (rather than allocated by tensorfs).
func (t *Tensor) Registered() bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.alloc != nil && t.alloc.foreign
}

// PinExport lets a peer daemon of this host read the tensor's memory in
// place: it pins the current allocation's MR (so the memory outlives a
// reallocation or an unlink meanwhile) and takes an IPC lease for holder,
// until Release is called; with keep, a second lease that lasts until its
// holder releases it or the export is revoked. ok is false when the tensor
// has no allocation or accept refuses its handle.
func (t *Tensor) PinExport(holder string, accept func(handle string) bool, keep bool) (ExportPin, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	a := t.alloc
	// Registered memory is its owner's, who may free it whatever tensorfs's
	// leases say: no peer keeps an import of it. Such copies go over TCP.
	if a == nil || t.released || a.foreign || !accept(a.export.Handle) {
		return ExportPin{}, false
	}
	unpin, err := t.s.MRs.Pin(a.region.ID)
	if err != nil {
		return ExportPin{}, false
	}
	lease, err := t.s.IPC.Lease(a.export.ID, holder)
	if err != nil {
		unpin()
		return ExportPin{}, false
	}
	p := ExportPin{Handle: a.export.Handle, Offset: a.export.Offset, AllocID: a.buf.ID(), ExportID: a.export.ID, Generation: t.gen,
		Release: func() { lease.Release(); unpin() }}
	if keep {
		p.Lease, _ = t.s.IPC.Lease(a.export.ID, holder+" (cached import)")
	}
	return p, true
}
