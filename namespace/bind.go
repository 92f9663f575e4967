package namespace

import (
	"syscall"

	"github.com/tensorfs/tensorfs/transfer"
)

// Bind implements transfer.Binder: a peer daemon of this host is bound to
// write the tensor at p in place, one-sided, through its own import of the
// tensor's allocation (tensor.BindExport). Errors: ENOENT, EISDIR for a
// directory, EOPNOTSUPP when the tensor cannot be bound (empty, registered
// memory, a handle kind accept refuses), EAGAIN when p was renamed while
// it was bound (the peer copies two-sided meanwhile).
func (f *Tree) Bind(p, holder string, accept func(handle string) bool) (transfer.Grant, error) {
	n, err := f.Resolve(p)
	if err != nil {
		return transfer.Grant{}, err
	}
	file, ok := n.(*File)
	if !ok {
		return transfer.Grant{}, errf(syscall.EISDIR, "%s is a directory", p)
	}
	be, ok := file.t.BindExport(holder, accept)
	if !ok {
		return transfer.Grant{}, errf(syscall.EOPNOTSUPP, "%s cannot be bound", p)
	}
	// A rename between the lookup and the binding did not revoke it: the
	// name must still lead here now that any later one will.
	if again, err := f.Resolve(p); err != nil || again != n {
		be.Binding.Release()
		be.Lease.Release()
		return transfer.Grant{}, errf(syscall.EAGAIN, "%s was renamed while it was bound", p)
	}
	return transfer.Grant{
		Desc:   transfer.IPCDesc{Handle: be.Handle, Offset: be.Offset, Alloc: be.AllocID, Export: be.ExportID, Generation: be.Generation, Leased: true},
		NBytes: be.Size, Device: be.Device, ExportLease: be.Lease, Lease: be.Binding,
	}, nil
}

// revokeBound revokes the bindings of the tensors at and below n (a file or
// directory renamed: its tensors' names changed), waiting for each.
func (f *Tree) revokeBound(n Node) {
	if f.store.Bindings() == 0 {
		return
	}
	switch x := n.(type) {
	case *File:
		x.t.RevokeBindings()
	case *Dir:
		for _, ref := range x.walk("", nil) {
			ref.f.t.RevokeBindings()
		}
	}
}

// CopyToMapping implements transfer.MappingSource: the source's bytes
// [off, off+n) (its descriptor's byte space) are written by the device into
// m, an import of a peer's allocation (Writes) whose destination tensor
// starts at base and ends at end (bytes).
func (s *fileSource) CopyToMapping(m transfer.Mapping, base, end, off, n int64) error {
	dst := m.(*bufferMapping).onDevice(s.t.Device())
	if s.meta.Spans == nil {
		src0, dst0 := s.off+off, base+s.meta.Off+off
		return copyErr(s.t.CopyRangesTo(dst, end, 1, func(int) (int64, int64, int64) { return src0, dst0, n }))
	}
	spans := s.meta.Spans
	if off == 0 && n == s.meta.NBytes {
		return copyErr(s.t.CopyRangesTo(dst, end, len(spans), func(k int) (int64, int64, int64) {
			sp := &spans[k]
			return sp.Src, base + sp.Dst, sp.N
		}))
	}
	// A piece of a large range list (the engine's progress pieces).
	type rng struct{ src, dst, n int64 }
	var rs []rng
	transfer.Pieces(spans, off, n, func(_, src, dst, k int64) error {
		rs = append(rs, rng{src, base + dst, k})
		return nil
	})
	return copyErr(s.t.CopyRangesTo(dst, end, len(rs), func(k int) (int64, int64, int64) {
		r := &rs[k]
		return r.src, r.dst, r.n
	}))
}

// Device implements transfer.MappingSource: the source tensor's device.
func (s *fileSource) Device() string { return s.t.Device() }

// Writes implements transfer.MappingSource: an import this store made.
func (s *fileSource) Writes(m transfer.Mapping) bool {
	_, ok := m.(*bufferMapping)
	return ok
}
