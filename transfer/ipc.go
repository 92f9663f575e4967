package transfer

import (
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/tensorfs/tensorfs/ipc"
)

// Exporter is implemented by sources whose memory another daemon of the same
// host can open in place (a host memfd, a CUDA IPC handle). Export pins the
// memory for one copy (until release is called) and describes it, when
// accept admits its handle; with keep it also returns a long-lived lease
// for holder, which outlives the copy so that the importer can cache its
// mapping (nil when the export cannot be leased). ok is false when the
// tensor has no export accept admits.
type Exporter interface {
	Export(holder string, accept func(handle string) bool, keep bool) (desc IPCDesc, release func(), lease PeerLease, ok bool)
}

// MappingDest is implemented by destinations that copy from an imported
// allocation themselves (device to device): n bytes of m at srcOff into
// descriptor i at its byte dstOff; done=false means "use ReadAt".
type MappingDest interface {
	CopyFromMapping(i int, m Mapping, srcOff, dstOff, n int64) (done bool, err error)
}

// PieceSizer is implemented by a MappingDest whose copies into some
// descriptors are so fast that splitting them for progress costs more than
// it shows (GPU memory: a GiB in half a millisecond, where each piece's
// synchronize costs tens of µs): Piece(i) is the most bytes one call moves
// into descriptor i, 0 for all at once, negative for the engine's default.
type PieceSizer interface {
	Piece(i int) int64
}

// progressPiece is the most one device-to-device call of an IPC copy moves,
// in bytes: a large tensor is copied in pieces of it so that its progress
// (stats, the sender's keepalives, tensorfs cp's bar) moves while it runs
// (a 4 GiB copy sat at 0% until its end), at a cost of one call per 64 MiB
// (tens of µs on a GPU, against the piece's own milliseconds).
const progressPiece = 64 << 20

// errNoIPC: the peer could not reach the exporter's memory (another PID
// namespace, no permission, a handle kind it cannot open); the copy is
// retried over TCP.
var errNoIPC = errors.New("exported memory not reachable")

// handleKind is the part of a handle before its colon ("memfd", "cuda").
func handleKind(h string) string {
	k, _, _ := strings.Cut(h, ":")
	return k
}

// exports pins and describes every source for an IPC copy to the peer of c
// (only handle kinds it opens), or returns ok=false (releasing what it
// took) when one of them cannot be exported, or when there is none: a
// request or reply with no descriptors is a TCP one (an empty directory
// sent as "ipc" was taken for a TCP put by the peer, which then waited
// for data and read the next request as a stray frame). With a lease
// channel lc, each export is also leased to the peer there, so that it may
// keep its import.
func (s *Service) exports(srcs []Source, c *conn, lc *leaseChan) (descs []IPCDesc, release func(), ok bool) {
	if len(srcs) == 0 {
		return nil, func() {}, false
	}
	var rels []func()
	var leased []uint64
	release = func() {
		for _, r := range rels {
			r()
		}
		for _, id := range leased {
			lc.afterCopy(id)
		}
	}
	accept := func(h string) bool { return slices.Contains(c.imports, handleKind(h)) }
	// Many descriptors of one call may read one tensor (its ranges): the
	// source exports it once and gives no lease for the others, which are
	// leased as the first one is.
	leasedExport := map[uint64]bool{}
	holder := "peer " + c.peer
	descs, rels = make([]IPCDesc, 0, len(srcs)), make([]func(), 0, len(srcs))
	for _, sc := range srcs {
		ex, is := sc.(Exporter)
		if !is {
			release()
			return nil, func() {}, false
		}
		d, rel, lease, ok := ex.Export(holder, accept, lc != nil)
		if !ok {
			release()
			return nil, func() {}, false
		}
		if lease != nil {
			// hold releases a duplicate itself; without a live channel
			// (none yet, or ended) the lease is given back here.
			d.Leased = lc != nil && lc.hold(d.Export, lease)
			if !d.Leased {
				lease.Release()
			} else {
				leased = append(leased, d.Export)
			}
			leasedExport[d.Export] = d.Leased
		} else {
			d.Leased = leasedExport[d.Export]
		}
		descs = append(descs, d)
		rels = append(rels, rel)
	}
	return descs, release, true
}

// importAll opens (or finds in the cache) the allocation of every
// descriptor the peer of c exported: one acquire per allocation and export
// however many descriptors (ranges) name it. entries is per descriptor;
// the caller releases held (each once). Errors wrap errNoIPC.
func (s *Service) importAll(c *conn, descs []IPCDesc) (entries, held []*importEntry, err error) {
	lc := s.chanTo(c.instance)
	entries = make([]*importEntry, 0, len(descs))
	type key struct {
		handle             string
		alloc, export, gen uint64
		leased             bool
	}
	seen := map[key]*importEntry{}
	open := func(h string) (Mapping, error) {
		if handleKind(h) == "memfd" {
			if err := checkOwner(c, h); err != nil {
				return nil, err
			}
		}
		return s.openHandle(h)
	}
	for _, d := range descs {
		k := key{d.Handle, d.Alloc, d.Export, d.Generation, d.Leased}
		if e := seen[k]; e != nil {
			entries = append(entries, e)
			continue
		}
		e, err := s.imports.acquire(c.instance, d, lc, open)
		if err != nil {
			s.releaseAll(held)
			return nil, nil, err
		}
		seen[k] = e
		held = append(held, e)
		entries = append(entries, e)
	}
	return entries, held, nil
}

func (s *Service) releaseAll(entries []*importEntry) {
	for _, e := range entries {
		s.imports.release(e)
	}
}

// checkOwner refuses a memfd handle that names any process but the peer's
// own (see peerproc.go). Errors wrap errNoIPC.
func checkOwner(c *conn, handle string) error {
	pid := handlePID(handle)
	if pid == 0 {
		return fmt.Errorf("handle %q names no process: %w", handle, errNoIPC)
	}
	if c.c.isOwner(pid) {
		return nil
	}
	ok, start, err := peerProcess(c.c, pid)
	if err != nil {
		return fmt.Errorf("handle %q: who is the peer: %v: %w", handle, err, errNoIPC)
	}
	if !ok {
		return fmt.Errorf("handle %q names process %d, which is not the peer %s: %w", handle, pid, c.peer, errNoIPC)
	}
	if start != "" {
		c.c.setOwner(pid, start)
	}
	return nil
}

// openHandle opens another daemon's exported allocation. Errors wrap
// errNoIPC.
func (s *Service) openHandle(handle string) (Mapping, error) {
	return s.openHandleFor(handle, false)
}

// openHandleFor is openHandle, a memfd opened for writing when write is set
// (a one-sided copy into it).
func (s *Service) openHandleFor(handle string, write bool) (Mapping, error) {
	kind := handleKind(handle)
	if kind == "memfd" {
		f, err := openMemfd(handle, write)
		if err != nil {
			return nil, err
		}
		if s.cfg.ImportFile == nil {
			return memfdMapping{f}, nil
		}
		defer f.Close()
		m, err := s.cfg.ImportFile(f)
		if err != nil {
			return nil, fmt.Errorf("import %q: %v: %w", handle, err, errNoIPC)
		}
		return m, nil
	}
	open, ok := s.cfg.Importers[kind]
	if !ok {
		return nil, fmt.Errorf("handle %q: no importer for %q: %w", handle, kind, errNoIPC)
	}
	m, err := open(handle)
	if err != nil {
		return nil, fmt.Errorf("open %q: %v: %w", handle, err, errNoIPC)
	}
	return m, nil
}

// openMemfd opens an exported memfd ("memfd:/proc/PID/fd/N"), and only if
// it is another daemon's tensor memory: a handle naming any other file (a
// peer's lie, or an fd number reused since it was exported) is refused.
// Checked on what was opened, not on the path, so the fd cannot change in
// between.
func openMemfd(handle string, write bool) (*os.File, error) {
	h, err := ipc.ParseHandle(handle)
	if err != nil || h.Kind != ipc.KindMemfd {
		return nil, fmt.Errorf("handle %q: %w", handle, errNoIPC)
	}
	path := h.Path()
	flag := os.O_RDONLY
	if write {
		flag = os.O_RDWR
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %v: %w", path, err, errNoIPC)
	}
	if target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd())); err != nil || !strings.HasPrefix(target, "/memfd:tensorfs") {
		f.Close()
		return nil, fmt.Errorf("handle %q is not a tensorfs memfd (%q): %w", handle, target, errNoIPC)
	}
	return f, nil
}

// memfdMapping reads an exported memfd with pread (never a mapping: memory
// another process owns could shrink under a mapping and fault; a short read
// is an EIO instead).
type memfdMapping struct{ f *os.File }

func (m memfdMapping) ReadAt(p []byte, off int64) (int, error) { return m.f.ReadAt(p, off) }
func (m memfdMapping) Close() error                            { return m.f.Close() }

// SpanMappingDest is implemented by destinations that copy a transfer's
// descriptors from imported allocations themselves, all at once, taking
// range lists as they are (on CUDA one gather/scatter kernel launch); the
// engine then builds no descriptor per span. done=false: copy them another
// way.
type SpanMappingDest interface {
	CopySpansFromMappings(copies []SpanCopy) (done bool, err error)
}

// SpanCopy is descriptor I of a transfer in imported allocation M, its
// source tensor's first byte at Base there: with Spans, a range list
// (Meta.Spans: each span's Src is from Base, its Dst in the destination
// tensor); without, the descriptor's N bytes from Base, into its
// destination from its first byte.
type SpanCopy struct {
	I     int
	M     Mapping
	Base  int64
	N     int64
	Spans []Span
}

// run is a contiguous piece of descriptor i's source in its imported
// allocation: n bytes at src into the descriptor's bytes at pos.
type run struct{ src, pos, n int64 }

// runsOf appends to rs where descriptor m's bytes are in the allocation
// desc exports: one run, or one per span. Errors: EPROTO for a span past
// int64 there.
func runsOf(rs []run, m Meta, desc IPCDesc) ([]run, error) {
	if m.Spans == nil {
		return append(rs, run{src: desc.Offset, n: m.NBytes}), nil
	}
	for _, sp := range m.Spans {
		if sp.Src > math.MaxInt64-desc.Offset {
			return nil, &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("span at %d of an export at %d", sp.Src, desc.Offset)}
		}
		if sp.N > 0 {
			rs = append(rs, run{desc.Offset + sp.Src, sp.Pos, sp.N})
		}
	}
	return rs, nil
}

// copyExports copies each descriptor from its imported allocation into
// dest: all at once by the destination when it can (SpanMappingDest), else
// one run (a descriptor, or a span of a range list) at a time by the
// destination (device to device, MappingDest), else through a host buffer.
//
// gone, checked before each piece, stops the copy with its error: the
// peer that exported the memory (and waits for this copy) went away.
func copyExports(entries []*importEntry, descs []IPCDesc, metas []Meta, dest Dest, chunk int, rec *Record, gone func() error) error {
	if sd, ok := dest.(SpanMappingDest); ok {
		if done, err := copySpanExports(sd, entries, descs, metas, rec); done || err != nil {
			return err
		}
	}
	n := 0
	for _, m := range metas {
		n += int(m.Descriptors())
	}
	// All descriptors' runs in one slice: descriptor i's are
	// all[at[i]:at[i+1]].
	all, at := make([]run, 0, n), make([]int, len(metas)+1)
	for i, m := range metas {
		var err error
		if all, err = runsOf(all, m, descs[i]); err != nil {
			return err
		}
		at[i+1] = len(all)
	}
	var buf []byte
	md, _ := dest.(MappingDest)
	for i, e := range entries {
		for _, r := range all[at[i]:at[i+1]] {
			done, err := copyRun(md, dest, i, e.m, r, rec, gone)
			if ge := gone(); err != nil && ge != nil {
				return ge
			}
			if err != nil {
				return &Error{Errno: syscall.EIO, Msg: fmt.Sprintf("copy %d bytes from %s at %d: %v", r.n, descs[i].Handle, r.src, err)}
			}
			if done {
				continue
			}
			if buf == nil {
				buf = make([]byte, chunk)
			}
			for off := int64(0); off < r.n; {
				if err := gone(); err != nil {
					return err
				}
				m := min(int64(chunk), r.n-off)
				got, err := e.m.ReadAt(buf[:m], r.src+off)
				if int64(got) != m {
					return &Error{Errno: syscall.EIO, Msg: fmt.Sprintf("read %s at %d: %d of %d bytes (%v)", descs[i].Handle, r.src+off, got, m, err)}
				}
				if err := dest.WriteAt(i, buf[:m], r.pos+off); err != nil {
					return err
				}
				off += m
				rec.BytesDone.Add(m)
			}
		}
	}
	return nil
}

// copySpanExports is copyExports' batch for a destination that takes
// range lists whole (SpanMappingDest), when the transfer has several
// descriptors or spans and none large (those are copied in pieces, for
// progress). done=false: it did not run.
func copySpanExports(sd SpanMappingDest, entries []*importEntry, descs []IPCDesc, metas []Meta, rec *Record) (bool, error) {
	pieces := 0
	var total int64
	for i, m := range metas {
		if m.NBytes >= progressPiece {
			return false, nil
		}
		for _, sp := range m.Spans {
			if sp.Src > math.MaxInt64-descs[i].Offset {
				return true, &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("span at %d of an export at %d", sp.Src, descs[i].Offset)}
			}
		}
		pieces += int(m.Descriptors())
		total += m.NBytes
	}
	if pieces < 2 {
		return false, nil
	}
	copies := make([]SpanCopy, len(metas))
	for i, e := range entries {
		copies[i] = SpanCopy{I: i, M: e.m, Base: descs[i].Offset, N: metas[i].NBytes, Spans: metas[i].Spans}
	}
	done, err := sd.CopySpansFromMappings(copies)
	if err != nil {
		return true, &Error{Errno: syscall.EIO, Msg: fmt.Sprintf("copy %d descriptors (%d bytes) from imports: %v", pieces, total, err)}
	}
	if done {
		rec.BytesDone.Add(total)
	}
	return done, nil
}

// copyRun copies run r of descriptor i from mapping m by the destination
// itself (md, device to device), in pieces of progressPiece (or what its
// PieceSizer says); done=false: md is nil or declines, copy through a
// buffer.
func copyRun(md MappingDest, dest Dest, i int, m Mapping, r run, rec *Record, gone func() error) (bool, error) {
	if md == nil {
		return false, nil
	}
	piece := int64(progressPiece)
	if ps, ok := dest.(PieceSizer); ok {
		switch p := ps.Piece(i); {
		case p == 0:
			piece = max(r.n, 1)
		case p > 0:
			piece = p
		}
	}
	for off := int64(0); off < r.n || r.n == 0; {
		if err := gone(); err != nil {
			return true, err
		}
		k := min(r.n-off, piece)
		done, err := md.CopyFromMapping(i, m, r.src+off, r.pos+off, k)
		if err != nil || !done {
			return done, err
		}
		rec.BytesDone.Add(k)
		if off += k; r.n == 0 {
			break
		}
	}
	return true, nil
}
