package tensor

import (
	"errors"
	"fmt"
	"sync"

	"github.com/tensorfs/tensorfs/gpu"
	"github.com/tensorfs/tensorfs/ipc"
)

// Binding is a peer daemon's hold on a tensor for one-sided in-place writes
// (DESIGN.md "In-place copies"; transfer's binds): while it lasts, the
// peer writes into the tensor's exported allocation through its own import,
// with no request to this daemon, trusting the size and the name it was
// given. So every change that would make such a write wrong revokes the
// binding first and waits for its Release: a change of size or allocation
// (lockToResize), an unlink (Unlink) and a rename of the file or of a
// directory above it (RevokeBindings, from the namespace). The peer
// releases once its writes in flight have landed, so a truncate, resize or
// unlink waits for them, as it waits for a two-sided copy's PinRange.
//
// Binding implements transfer.PeerLease.
type Binding struct {
	t        *Tensor
	revoked  chan struct{}
	released chan struct{}
	revOnce  sync.Once
	relOnce  sync.Once
}

// Revoked is closed when the tensor needs the binding back.
func (b *Binding) Revoked() <-chan struct{} { return b.revoked }

// Release ends the binding; safe to call more than once. Whoever holds a
// binding must release it, revoked or not (the tensor's change waits).
func (b *Binding) Release() {
	b.relOnce.Do(func() {
		t := b.t
		t.mu.Lock()
		delete(t.binds, b)
		t.mu.Unlock()
		t.s.bound.Add(-1)
		close(b.released)
	})
}

func (b *Binding) revoke() { b.revOnce.Do(func() { close(b.revoked) }) }

// BoundExport is what BindExport gives a peer daemon for one-sided writes:
// the tensor's export (Handle opens the whole allocation, the tensor's
// byte 0 at Offset), leased (Lease: the allocation is not freed until the
// peer gives it back), with the tensor's size in bytes and device, and the
// Binding that keeps that size and its name valid.
type BoundExport struct {
	Handle     string
	Offset     int64
	AllocID    uint64
	ExportID   uint64
	Generation uint64
	Size       int64
	Device     string
	Lease      *ipc.Lease
	Binding    *Binding
}

// BindExport binds the tensor for holder's one-sided writes (see Binding)
// and leases its export to it, when the tensor is linked, allocated with
// memory of its own (not registered: its owner may free it whatever
// tensorfs says), non-empty, and accept admits its handle. ok is false
// otherwise. The caller releases both the lease and the binding.
func (t *Tensor) BindExport(holder string, accept func(handle string) bool) (BoundExport, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.alloc
	if a == nil || t.released || !t.linked || a.foreign || t.size == 0 || !accept(a.export.Handle) {
		return BoundExport{}, false
	}
	lease, err := t.s.IPC.Lease(a.export.ID, holder+" (bound)")
	if err != nil {
		return BoundExport{}, false
	}
	b := &Binding{t: t, revoked: make(chan struct{}), released: make(chan struct{})}
	if t.binds == nil {
		t.binds = map[*Binding]struct{}{}
	}
	t.binds[b] = struct{}{}
	t.s.bound.Add(1)
	return BoundExport{Handle: a.export.Handle, Offset: a.export.Offset, AllocID: a.buf.ID(), ExportID: a.export.ID,
		Generation: t.gen, Size: t.size, Device: t.device, Lease: lease, Binding: b}, true
}

// RevokeBindings revokes every binding of the tensor and waits until each
// is released (its peer's writes have landed, or the peer is gone: the
// peer service bounds the wait by its timeout). The namespace calls it
// when the tensor's file, or a directory above it, is renamed.
func (t *Tensor) RevokeBindings() {
	t.mu.Lock()
	t.revokeBindsLocked()
	t.mu.Unlock()
}

// revokeBindsLocked is RevokeBindings with t.mu held (write); it drops the
// lock while it waits, and returns with it held and no binding left that
// it saw (a binding made meanwhile is the caller's to check: t.binds).
func (t *Tensor) revokeBindsLocked() {
	if len(t.binds) == 0 {
		return
	}
	bs := make([]*Binding, 0, len(t.binds))
	for b := range t.binds {
		bs = append(bs, b)
	}
	t.mu.Unlock()
	for _, b := range bs {
		b.revoke()
	}
	for _, b := range bs {
		<-b.released
	}
	t.mu.Lock()
}

// Bindings is the number of live bindings of the store's tensors (the
// namespace walks a renamed directory for them only when there are any).
func (s *Store) Bindings() int64 { return s.bound.Load() }

// CopyRangesTo copies n ranges of the tensor into dst, the k-th (at(k))
// bytes [srcOff, srcOff+len) of the tensor to byte dstOff of dst, as one
// batch (gpu.CopyRanges: on CUDA one gather/scatter kernel launch): a
// one-sided write into a peer's allocation, imported here. Each
// destination range must end by dstLen (the peer tensor's end in dst).
// The caller holds the tensor still (Freeze). Every range is checked first;
// one outside the tensor, dst or dstLen is ErrInvalid and nothing is
// copied. Errors: ErrInvalid, ErrReleased, the device's.
func (t *Tensor) CopyRangesTo(dst gpu.Buffer, dstLen int64, n int, at func(k int) (srcOff, dstOff, n int64)) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.released {
		return ErrReleased
	}
	for k := range n {
		s, _, l := at(k)
		if s < 0 || l < 0 || s > t.size-l {
			return fmt.Errorf("range [%d, +%d) of a %d-byte tensor: %w", s, l, t.size, ErrInvalid)
		}
	}
	if t.alloc == nil {
		return nil // every range is empty
	}
	err := gpu.CopyRanges([]gpu.RangeList{{Dst: dst, DstLen: dstLen, Src: t.alloc.buf, N: n, At: at}})
	if err != nil && errors.Is(err, gpu.ErrInvalidSize) {
		return fmt.Errorf("%v: %w", err, ErrInvalid)
	}
	return err
}
