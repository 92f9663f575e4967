package tensor

import (
	"github.com/tensorfs/tensorfs/ipc"
)

// A tensor's lifetime: open handles (each a local importer's lease), unlink,
// and the final release that deregisters, revokes and frees.

// Handle is one open file handle on a tensor: it keeps the tensor alive after
// unlink and, while the tensor is allocated, holds a lease on its IPC export
// (the open file is a local importer's lease).
type Handle struct {
	t      *Tensor
	holder string
	lease  *ipc.Lease
}

// Open returns a new handle; holder names it in logs ("fh pid 1234"). Errors:
// ErrReleased.
func (t *Tensor) Open(holder string) (*Handle, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.released {
		return nil, ErrReleased
	}
	h := &Handle{t: t, holder: holder}
	h.relase(t)
	t.handles[h] = struct{}{}
	return h, nil
}

// relase moves the handle's lease to the tensor's current export. t.mu is held.
func (h *Handle) relase(t *Tensor) {
	h.dropLease()
	if t.alloc != nil {
		// The export was just created or is the live one, so it cannot be revoked.
		h.lease, _ = t.s.IPC.Lease(t.alloc.export.ID, h.holder)
	}
}

func (h *Handle) dropLease() {
	if h.lease != nil {
		h.lease.Release()
		h.lease = nil
	}
}

// Close ends the handle; the tensor is released when this was its last handle
// and it has no name. Closing twice does nothing.
func (h *Handle) Close() {
	t := h.t
	t.mu.Lock()
	if _, ok := t.handles[h]; !ok {
		t.mu.Unlock()
		return
	}
	delete(t.handles, h)
	h.dropLease()
	t.mu.Unlock()
	t.maybeRelease()
}

// Unlink removes the tensor's name; it is released now if no handle is open,
// else at the last Close.
func (t *Tensor) Unlink() {
	defer t.flushAttrs(t.attrGen.Load())
	t.mu.Lock()
	if t.linked {
		t.linked = false
		t.attrsChanged()
	}
	// A peer bound to write it by its name: the name is gone.
	t.revokeBindsLocked()
	t.mu.Unlock()
	t.maybeRelease()
}

// Linked reports whether the tensor still has a name.
func (t *Tensor) Linked() bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.linked
}

// maybeRelease deregisters, revokes and frees everything once the tensor has
// neither a name nor an open handle.
func (t *Tensor) maybeRelease() {
	t.mu.Lock()
	if t.released || t.linked || len(t.handles) > 0 {
		t.mu.Unlock()
		return
	}
	t.released = true
	a := t.alloc
	t.alloc = nil
	t.mu.Unlock()
	t.s.retire(a)
	t.s.mu.Lock()
	delete(t.s.live, t)
	t.s.mu.Unlock()
}
