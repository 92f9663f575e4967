package namespace

import (
	"fmt"
	"syscall"

	"github.com/tensorfs/tensorfs/dtype"
	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
)

// tmpPrefix names the temporaries a copy writes before renaming them into
// place; directory copies skip them.
const tmpPrefix = ".tensorfs-tmp-"

// tmpMode is a copy's temporary's mode until Commit gives it copyMode, the
// mode of a tensor a copy creates.
const (
	tmpMode  = 0o600
	copyMode = 0o644
)

// errf returns a transfer.Error with an errno, for copies.
func errf(errno syscall.Errno, format string, args ...any) error {
	return &transfer.Error{Errno: errno, Msg: fmt.Sprintf(format, args...)}
}

// metaOf describes a tensor for a copy.
func metaOf(t *tensor.Tensor, rel string) transfer.Meta {
	in := t.Info()
	d, sh := in.DType, in.Shape
	if d == "" {
		d = "U8"
	}
	if sh == nil {
		sh = dtype.Shape{in.Size * 8 / int64(d.Bits())}
	}
	return transfer.Meta{Rel: rel, DType: string(d), Shape: sh.String(), NBytes: in.Size}
}

// fileSource reads one tensor for a copy, holding it open (alive) until Close.
type fileSource struct {
	t    *tensor.Tensor
	h    *tensor.Handle
	thaw func() // the tensor is frozen (tensor.Freeze) while the copy reads it
	meta transfer.Meta
}

// Meta implements transfer.Source.
func (s *fileSource) Meta() transfer.Meta { return s.meta }

// ReadAt implements transfer.Source.
func (s *fileSource) ReadAt(p []byte, off int64) (int, error) {
	n, err := s.t.ReadAt(p, off)
	return n, copyErr(err)
}

// Close implements transfer.Source: the tensor thaws and may be released.
func (s *fileSource) Close() {
	s.thaw()
	s.h.Close()
}

// Export implements transfer.Exporter: a peer of this host opens the
// tensor's allocation in place while the pin and lease are held.
func (s *fileSource) Export(holder string, accept func(string) bool, keep bool) (transfer.IPCDesc, func(), transfer.PeerLease, bool) {
	p, ok := s.t.PinExport(holder, accept, keep)
	if !ok {
		return transfer.IPCDesc{}, nil, nil, false
	}
	d := transfer.IPCDesc{Handle: p.Handle, Offset: p.Offset, Alloc: p.AllocID, Export: p.ExportID, Generation: p.Generation}
	if p.Lease == nil {
		return d, p.Release, nil, true
	}
	return d, p.Release, p.Lease, true
}

// openSource opens f's tensor for a copy that names it rel.
func openSource(f *File, rel string) (*fileSource, error) {
	h, err := f.t.Open("copy")
	if err != nil {
		return nil, copyErr(err)
	}
	// Frozen before its metadata is read: the copy sends this size and
	// these bytes, whoever writes the tensor meanwhile (the write waits).
	thaw := f.t.Freeze()
	return &fileSource{t: f.t, h: h, thaw: thaw, meta: metaOf(f.t, rel)}, nil
}

// sources opens the tensors of a node: one for a file, all below a directory.
func sources(n Node) ([]transfer.Source, bool, error) {
	var refs []fileRef
	isDir := false
	switch x := n.(type) {
	case *File:
		refs = []fileRef{{f: x}}
	case *Dir:
		isDir = true
		refs = x.walk("", nil)
	}
	srcs := make([]transfer.Source, 0, len(refs))
	for _, r := range refs {
		s, err := openSource(r.f, r.rel)
		if err != nil {
			for _, o := range srcs {
				o.Close()
			}
			return nil, false, err
		}
		srcs = append(srcs, s)
	}
	return srcs, isDir, nil
}

// Get implements transfer.Local.
func (f *Tree) Get(p string) ([]transfer.Source, bool, error) {
	n, err := f.Resolve(p)
	if err != nil {
		return nil, false, err
	}
	return sources(n)
}

// Put implements transfer.Local: temporaries in the destination directories,
// renamed into place through the mount at Commit (so inotify watchers see
// IN_MOVED_TO).
func (f *Tree) Put(p string, isDir bool, metas []transfer.Meta) (transfer.Dest, error) {
	return f.prepare(p, isDir, metas, nil, true)
}

// WriteInPlace lets a peer copy receive tensor i's bytes from its socket
// straight into the temporary's memory when that is host memory
// (tensor.WriteInPlace); ok is false for GPU memory (the copy then stages
// through WriteAt).
func (d *dest) WriteInPlace(i int, off, n int64, fill func(p []byte) error) (bool, error) {
	ok, err := d.items[i].temp.WriteInPlace(off, n, fill)
	return ok, copyErr(err)
}
