package namespace

import (
	"fmt"
	"strconv"
	"sync"
	"syscall"

	"github.com/tensorfs/tensorfs/dtype"
	"github.com/tensorfs/tensorfs/gpu"
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

// fileSource reads one tensor, or bytes [off, off+meta.NBytes) of it, for
// a copy, holding it open (alive) and frozen until Close. The sources of
// one call that read the same tensor share one open and one freeze
// (sourceSet).
type fileSource struct {
	t    *tensor.Tensor
	off  int64
	meta transfer.Meta // with Spans: a range list (addSpan), off 0
	ref  *openTensor
	// ownSpans: meta.Spans came from spanPool (addSpan), and goes back
	// at Close.
	ownSpans bool
}

// spanPool keeps range lists' span slices (*[]transfer.Span) from one
// call to the next: a 1000-descriptor call's spans are 32 KB, whose
// allocation, cleared, cost the sender 10 µs of its 32 µs of planning on
// the 2-core VM (2026-12-07). A source's spans are read only while the
// call runs (its transfer, or a local destination's items, committed
// before the call's sources close), so they go back at Close.
var spanPool sync.Pool

// Span slices of fewer than minPooledSpans are not worth a pool's
// round trip; of more than maxPooledSpans (a 64 KiB value's lines), they
// would keep too much.
const (
	minPooledSpans = 64
	maxPooledSpans = 1 << 14
)

// newSpans is an empty span slice with room for n, from spanPool when it
// has one of n to 2n (a larger one would make a small call keep more than
// spanRoom gives it).
func newSpans(n int) []transfer.Span {
	if n >= minPooledSpans {
		if b, ok := spanPool.Get().(*[]transfer.Span); ok {
			if c := cap(*b); c >= n && c <= 2*n {
				return (*b)[:0]
			}
			spanPool.Put(b)
		}
	}
	return make([]transfer.Span, 0, n)
}

// freeSpans gives spans, which nothing reads any more, back to spanPool.
func freeSpans(spans []transfer.Span) {
	if c := cap(spans); c >= minPooledSpans && c <= maxPooledSpans {
		spans = spans[:0]
		spanPool.Put(&spans)
	}
}

// openTensor is a tensor open for a call's sources: one handle and one
// freeze, dropped with the last of them; and one export pin for all of
// them (exp), when the call goes to a peer of this host.
type openTensor struct {
	h    *tensor.Handle
	thaw func() // the tensor is frozen (tensor.Freeze) while the copy reads it
	refs int
	exp  *sharedExport
	meta transfer.Meta // metaOf at the open (frozen: it cannot change)
	// partShape is the shape of the last part (range) opened, partN bytes.
	partN     int64
	partShape string
}

// sharedExport is one export pin of a tensor, shared by the sources of a
// call that read it (its ranges): released with the last of them.
type sharedExport struct {
	holder  string
	keep    bool
	desc    transfer.IPCDesc
	release func()
	refs    int // 0: released (a later transfer of the call pins anew)
}

// Meta implements transfer.Source.
func (s *fileSource) Meta() transfer.Meta { return s.meta }

// ReadAt implements transfer.Source. A range list's bytes are gathered
// from its spans' sources (tensor.Gather: on a GPU one gather kernel and
// one device-to-host copy per read).
func (s *fileSource) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || int64(len(p)) > s.meta.NBytes-off {
		p = p[:max(0, min(int64(len(p)), s.meta.NBytes-off))]
	}
	if s.meta.Spans == nil {
		n, err := s.t.ReadAt(p, s.off+off)
		return n, copyErr(err)
	}
	// Per read, not per source: the sender's readers read one source's
	// chunks at once (a shared list behind a lock serialized them).
	var arr [64]tensor.Piece
	pieces := arr[:0]
	transfer.Pieces(s.meta.Spans, off, int64(len(p)), func(_, src, _, n int64) error {
		pieces = append(pieces, tensor.Piece{Off: src, N: n})
		return nil
	})
	var scratch gpu.Buffer
	if len(pieces) > 1 {
		// GPU memory gathers in device scratch (nil for host memory,
		// or none to be had: piece by piece then).
		var release func()
		scratch, release, _ = s.t.Scratch(int64(len(p)))
		defer release()
	}
	if err := s.t.Gather(p, pieces, scratch); err != nil {
		return 0, copyErr(err)
	}
	return len(p), nil
}

// Close implements transfer.Source: the tensor thaws and may be released
// once the call's last source of it is closed.
func (s *fileSource) Close() {
	if s.ref == nil {
		return
	}
	if s.ownSpans {
		freeSpans(s.meta.Spans)
		s.meta.Spans, s.ownSpans = nil, false
	}
	if s.ref.refs--; s.ref.refs == 0 {
		s.ref.thaw()
		s.ref.h.Close()
	}
	s.ref = nil
}

// addSpan makes s, an in-place source of one range, a range list (or one
// with one more span): n bytes at src of the tensor into the destination at
// dst, after the bytes s has. The lines of one call between one source
// tensor and one destination tensor become one descriptor this way (see
// transfer.Span for why). The first span added makes room for hint spans.
func (s *fileSource) addSpan(src, dst, n int64, hint int) {
	s.asList(hint)
	m := &s.meta
	m.Spans = append(m.Spans, transfer.Span{Pos: m.NBytes, Src: src, Dst: dst, N: n})
	m.NBytes += n
}

// asList makes s, an in-place source of one range, a range list of that
// range, with room for hint spans; a list stays as it is.
func (s *fileSource) asList(hint int) {
	m := &s.meta
	if m.Spans != nil {
		return
	}
	m.Spans = append(newSpans(max(2, hint)), transfer.Span{Pos: 0, Src: s.off, Dst: m.Off, N: m.NBytes})
	s.ownSpans = true
	s.off, m.Off = 0, 0
	// A range list has no shape of its own but its bytes.
	m.DType = "U8"
}

// Export implements transfer.Exporter: a peer of this host opens the
// tensor's allocation in place while the pin and lease are held.
//
// The sources of one call that read one tensor share its first export (one
// pin; the lease only with the first: transfer leases the others alike).
func (s *fileSource) Export(holder string, accept func(string) bool, keep bool) (transfer.IPCDesc, func(), transfer.PeerLease, bool) {
	if e := s.ref.exp; e != nil && e.refs > 0 && e.holder == holder && e.keep == keep {
		e.refs++
		d := e.desc
		d.Offset += s.off
		return d, e.done, nil, true
	}
	p, ok := s.t.PinExport(holder, accept, keep)
	if !ok {
		return transfer.IPCDesc{}, nil, nil, false
	}
	e := &sharedExport{holder: holder, keep: keep, desc: transfer.IPCDesc{Handle: p.Handle, Offset: p.Offset, Alloc: p.AllocID, Export: p.ExportID, Generation: p.Generation}, release: p.Release, refs: 1}
	s.ref.exp = e
	d := e.desc
	d.Offset += s.off
	if p.Lease == nil {
		return d, e.done, nil, true
	}
	return d, e.done, p.Lease, true
}

// done is one source's release of the shared export: the pin ends with the
// last.
func (e *sharedExport) done() {
	if e.refs--; e.refs == 0 {
		e.release()
	}
}

// sourceSet opens the sources of one call: a tensor named by several
// descriptors (ranges of it) is opened and frozen once. Not safe for
// concurrent use; the sources it made are closed by their Close.
type sourceSet map[*tensor.Tensor]*openTensor

// open opens f's tensor for a copy that names it rel, all of it or its
// bytes r names (r's length defaults to the rest of the tensor). Errors:
// EINVAL for a range outside the tensor; ENOENT for a released one.
func (ss sourceSet) open(f *File, rel string, r transfer.Range) (*fileSource, error) {
	ref := ss[f.t]
	if ref == nil || ref.refs == 0 {
		h, err := f.t.Open("copy")
		if err != nil {
			return nil, copyErr(err)
		}
		// Frozen before its metadata is read: the copy sends this size and
		// these bytes, whoever writes the tensor meanwhile (the write waits).
		ref = &openTensor{h: h, thaw: f.t.Freeze()}
		ref.meta = metaOf(f.t, "")
		ss[f.t] = ref
	}
	meta := ref.meta
	meta.Rel = rel
	s := &fileSource{t: f.t, meta: meta}
	if r.Set {
		size := meta.NBytes
		off, n, err := rangeIn(size, r)
		if err != nil {
			if ref.refs == 0 {
				ref.thaw()
				ref.h.Close()
				delete(ss, f.t)
			}
			return nil, err
		}
		s.off, s.meta.NBytes = off, n
		if n != size {
			// A part of the tensor: no shape of its own.
			if ref.partN != n {
				// Formatted once for a call's thousand same-sized ranges.
				ref.partN, ref.partShape = n, strconv.FormatInt(n, 10)
			}
			s.meta.DType, s.meta.Shape = "U8", ref.partShape
		}
	}
	ref.refs++
	s.ref = ref
	return s, nil
}

// openSpans opens f as a range list (a peer's range-list get,
// transfer.Pull.Spans): the spans' bytes of the tensor, each span inside
// it. Errors: EINVAL for a span outside the tensor; open's.
func (ss sourceSet) openSpans(f *File, spans []transfer.Span) (*fileSource, error) {
	s, err := ss.open(f, "", transfer.Range{})
	if err != nil {
		return nil, err
	}
	size := s.meta.NBytes
	for _, sp := range spans {
		if _, _, err := rangeIn(size, transfer.Range{Set: true, Off: sp.Src, Len: sp.N, HasLen: true}); err != nil {
			s.Close()
			return nil, err
		}
	}
	m := &s.meta
	m.Spans, m.NBytes, m.InPlace, m.Off = spans, transfer.SpanEnd(spans), true, 0
	// A range list has no shape of its own but its bytes.
	m.DType, m.Shape = "U8", strconv.FormatInt(m.NBytes, 10)
	return s, nil
}

// rangeIn is the offset and length of source range r of a tensor of size
// bytes (r's length defaults to the rest of the tensor). Errors: EINVAL for
// a range outside the tensor.
func rangeIn(size int64, r transfer.Range) (off, n int64, err error) {
	n = size - r.Off
	if r.HasLen {
		n = r.Len
	}
	if r.Off < 0 || r.Off > size || n < 0 || n > size-r.Off {
		return 0, 0, errf(syscall.EINVAL, "source range %s of a %d-byte tensor", r, size)
	}
	return r.Off, n, nil
}

// sources opens the tensors of a node: one for a file (r: its bytes to
// read), all below a directory (which takes no range: EINVAL), each of
// which caller c must be allowed to read (mayRead; nil: a peer's copy).
// Errors: EINVAL, EACCES, open's.
func sources(n Node, r transfer.Range, c *Caller) ([]transfer.Source, bool, error) {
	var refs []fileRef
	isDir := false
	switch x := n.(type) {
	case *File:
		refs = []fileRef{{f: x}}
	case *Dir:
		if r.Set || r.Spans != nil {
			return nil, false, errf(syscall.EINVAL, "a source range (%s) on a directory", r)
		}
		isDir = true
		refs = x.walk("", nil)
	}
	if d, ok := n.(*Dir); ok {
		if err := d.mayList(c); err != nil {
			return nil, false, err
		}
	}
	for _, ref := range refs {
		if err := mayRead(c, ref.f); err != nil {
			return nil, false, err
		}
	}
	set := sourceSet{}
	if r.Spans != nil && len(refs) == 1 {
		s, err := set.openSpans(refs[0].f, r.Spans)
		if err != nil {
			return nil, false, err
		}
		return []transfer.Source{s}, false, nil
	}
	srcs := make([]transfer.Source, 0, len(refs))
	for _, ref := range refs {
		s, err := set.open(ref.f, ref.rel, r)
		if err != nil {
			closeAll(srcs)
			return nil, false, err
		}
		srcs = append(srcs, s)
	}
	return srcs, isDir, nil
}

// closeAll closes a copy's sources.
func closeAll(srcs []transfer.Source) {
	for _, s := range srcs {
		s.Close()
	}
}

// Get implements transfer.Local.
func (f *Tree) Get(p string, r transfer.Range) ([]transfer.Source, bool, error) {
	n, err := f.Resolve(p)
	if err != nil {
		return nil, false, err
	}
	return sources(n, r, nil)
}

// Put implements transfer.Local: temporaries in the destination directories,
// renamed into place through the mount at Commit (so inotify watchers see
// IN_MOVED_TO).
func (f *Tree) Put(p string, isDir bool, metas []transfer.Meta) (transfer.Dest, error) {
	return f.prepare(p, isDir, metas, prepOpts{viaMount: true})
}

// WriteInPlace lets a peer copy receive tensor i's bytes from its socket
// straight into the temporary's memory when that is host memory
// (tensor.WriteInPlaceV); ok is false for GPU memory (the copy then stages
// through WriteAt). A range list's bytes are its spans' pieces, in order.
// Ranges that overlap others of the copy are declined too (findShared).
func (d *dest) WriteInPlace(i int, off, n int64, fill func(iov [][]byte) (int64, error)) (bool, error) {
	d.sharedOnce.Do(d.findShared)
	if d.shared[i] {
		return false, nil
	}
	var t *tensor.Tensor
	var arr [64]tensor.Piece
	pieces := arr[:0]
	err := d.pieces(i, off, n, func(pt *tensor.Tensor, dst, _, k int64) error {
		t = pt
		// Pieces adjacent in the destination are one: a range list
		// gathered into contiguous bytes is read by one iovec and summed
		// in one pass.
		if l := len(pieces) - 1; l >= 0 && pieces[l].Off+pieces[l].N == dst {
			pieces[l].N += k
			return nil
		}
		pieces = append(pieces, tensor.Piece{Off: dst, N: k})
		return nil
	})
	if err != nil {
		return true, err
	}
	if t == nil { // no bytes
		t, _ = d.at(i)
	}
	ok, err := t.WriteInPlaceV(pieces, fill)
	return ok, copyErr(err)
}

// RMAMemory implements transfer.RMASource: the tensor's host memory, held
// still by the source's freeze and open handle until Close.
func (s *fileSource) RMAMemory() (transfer.RMAMemory, bool) {
	mem, rkey, ok := s.t.HostMemory()
	if !ok {
		return transfer.RMAMemory{}, false
	}
	return transfer.RMAMemory{Mem: mem, Rkey: rkey, Off: s.off}, true
}

// RMAMemory implements transfer.RMADest: descriptor i's tensor's host
// memory (its temporary, or its in-place tensor, pinned), until Commit or
// Abort. Ranges that overlap others of the copy are declined (findShared):
// their order is the lines' order, which posted gets do not keep.
func (d *dest) RMAMemory(i int) (transfer.RMAMemory, bool) {
	d.sharedOnce.Do(d.findShared)
	if d.shared[i] {
		return transfer.RMAMemory{}, false
	}
	t, off := d.at(i)
	mem, rkey, ok := t.HostMemory()
	if !ok {
		return transfer.RMAMemory{}, false
	}
	return transfer.RMAMemory{Mem: mem, Rkey: rkey, Off: off}, true
}
