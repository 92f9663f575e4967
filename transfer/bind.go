package transfer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// One-sided in-place copies between daemons of one host ("binds").
//
// A two-sided in-place copy to a peer of this host costs a request and a
// reply, and the peer's work between them (decode the table, resolve and
// pin the destination, import the source, copy, answer): on an H100 host
// 40-60 µs of a 4 KiB copy's 100 and of a 1000-block scatter's 150. NIXL's
// and UCCL's IPC paths write into the peer's registered memory one-sided.
// So after an in-place copy to a peer's file, the sender asks for a
// binding of that path on the lease channel (frameBind): the peer leases
// the destination tensor's export to it (as it leases a source's) and
// binds the tensor (tensor.Binding), answering with the export, the
// tensor's size and device (frameBound). From then on an in-place copy to
// that path is the sender's alone: it writes through its own import of the
// peer's allocation (on CUDA one kernel launch over the ranges), checks
// the ranges against the size it was given, and asks nothing.
//
// What keeps that right is the binding's revocation: every change that
// would make such a write land wrong (a resize or reallocation of the
// tensor, an unlink, a rename of the file or of a directory above it)
// revokes the binding first on the lease channel (frameRevoke with the
// binding's id) and waits for the sender's frameRevoked, which comes once
// the sender's writes in flight have landed. So the change waits for them,
// as it waits for a two-sided copy's pin, and no write starts after it.
// The channel is ordered: the answer to a bind goes out under the
// channel's writer lock, before any revocation of what it grants. A dead
// channel ends every binding through it on both sides. The export's own
// lease still guards the memory (its revocation drops the binding too).
//
// The peer does not see one-sided copies: its stats count none (the
// sender's do, on path "ipc"), as an RDMA WRITE's target counts none.

// Binder is implemented by a Local that binds its tensors for peers'
// one-sided writes (namespace.Tree).
type Binder interface {
	// Bind binds the tensor file at path (cleaned) for holder's one-sided
	// in-place writes and leases its export, when accept admits its
	// handle. Errors carry an errno (ENOENT, EISDIR, EOPNOTSUPP).
	Bind(path, holder string, accept func(handle string) bool) (Grant, error)
}

// Grant is a binding as Bind makes it: the destination tensor's export
// (Desc, with Leased set: ExportLease holds it), its size in bytes and
// device, and Lease, revoked when the path stops naming those bytes. The
// service releases both leases.
type Grant struct {
	Desc        IPCDesc
	NBytes      int64
	Device      string
	ExportLease PeerLease
	Lease       PeerLease
}

// MappingSource is implemented by sources that write their bytes into an
// imported allocation themselves (a one-sided in-place copy).
type MappingSource interface {
	// Writes reports whether CopyToMapping can write into m.
	Writes(m Mapping) bool
	// CopyToMapping writes the source's bytes [off, off+n) (its
	// descriptor's byte space) into m, one Writes admits, whose
	// destination tensor starts at byte base and ends at byte end of m: a
	// range at destination byte d lands at base+d.
	CopyToMapping(m Mapping, base, end, off, n int64) error
	// Device is the source tensor's device ("host", "cuda:0").
	Device() string
}

// bindIDBit marks binding ids, which travel in frameRevoke and
// frameRevoked beside export ids (ipc_ids, counted from 1, never near it).
const bindIDBit = 1 << 62

// maxBinds bounds the bindings a node holds (each holds a lease on the
// peer and an import here); past it the least recently used are given
// back. refuseFor is how long a refused bind is not asked again.
const (
	maxBinds  = 4096
	refuseFor = 2 * time.Second
)

// bindMsg asks for a binding (frameBind, either way on a lease channel).
type bindMsg struct {
	Path  string   `json:"path"`
	Kinds []string `json:"kinds"` // the handle kinds the asker imports
}

// boundMsg answers a bindMsg (frameBound).
type boundMsg struct {
	Path   string  `json:"path"`
	ID     uint64  `json:"id,omitempty"`
	NBytes int64   `json:"nbytes,omitempty"`
	Device string  `json:"device,omitempty"`
	IPC    IPCDesc `json:"ipc"`
	Err    string  `json:"err,omitempty"`
}

type bindKey struct{ instance, path string }

// boundDest is a binding this node holds: where the peer's tensor at a path
// is, for one-sided writes.
type boundDest struct {
	key    bindKey
	id     uint64
	lc     *leaseChan
	desc   IPCDesc
	nbytes int64
	device string
	used   int64 // the cache's clock at the last take

	mu    sync.Mutex // guards users, dead, idle and entry
	users int
	dead  bool
	idle  chan struct{} // closed when the last user leaves a dead binding
	entry *importEntry  // the writable import, once a copy opened it
}

// bindCache holds this node's bindings.
type bindCache struct {
	mu      sync.Mutex
	m       map[bindKey]*boundDest
	pending map[bindKey]*leaseChan // asked, not answered yet
	refused map[bindKey]time.Time
	clock   int64
}

func (bc *bindCache) init() {
	if bc.m == nil {
		bc.m = map[bindKey]*boundDest{}
		bc.pending = map[bindKey]*leaseChan{}
		bc.refused = map[bindKey]time.Time{}
	}
}

// take returns the live binding of path on the peer instance, with one
// more user, or nil.
func (bc *bindCache) take(instance, path string) *boundDest {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	b := bc.m[bindKey{instance, path}]
	if b == nil {
		return nil
	}
	bc.clock++
	b.used = bc.clock
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dead {
		return nil
	}
	b.users++
	return b
}

// put ends one use of b.
func (b *boundDest) put() {
	b.mu.Lock()
	if b.users--; b.users == 0 && b.dead && b.idle != nil {
		close(b.idle)
		b.idle = nil
	}
	b.mu.Unlock()
}

// kill ends b (out of the cache already) and waits for its users.
func (b *boundDest) kill() {
	b.mu.Lock()
	b.dead = true
	var wait chan struct{}
	if b.users > 0 {
		if b.idle == nil {
			b.idle = make(chan struct{})
		}
		wait = b.idle
	}
	b.mu.Unlock()
	if wait != nil {
		<-wait
	}
}

// drop takes the bindings that match out of the cache, and the pending
// asks through lc when all is set, and ends them, waiting for their users.
func (bc *bindCache) drop(match func(b *boundDest) bool, lc *leaseChan, all bool) []*boundDest {
	bc.mu.Lock()
	var gone []*boundDest
	for k, b := range bc.m {
		if match(b) {
			delete(bc.m, k)
			gone = append(gone, b)
		}
	}
	if all {
		for k, via := range bc.pending {
			if via == lc {
				delete(bc.pending, k)
			}
		}
	}
	bc.mu.Unlock()
	for _, b := range gone {
		b.kill()
	}
	return gone
}

// revoke ends the bindings through lc that ids name, by their own id or
// their export's, and returns them.
func (bc *bindCache) revoke(lc *leaseChan, ids []uint64) []*boundDest {
	return bc.drop(func(b *boundDest) bool {
		return b.lc == lc && (slices.Contains(ids, b.id) || slices.Contains(ids, b.desc.Export))
	}, lc, false)
}

// dropChan ends every binding through lc (its channel ended).
func (bc *bindCache) dropChan(lc *leaseChan) {
	bc.drop(func(b *boundDest) bool { return b.lc == lc }, lc, true)
}

// givenBack are the lease ids to give back to the peer for bindings that
// ended (killed already): each binding's own, and its export's when no
// import here holds that lease (a binding never written through, or one
// whose import went): the peer holds that lease for this node until told,
// and held it for every tensor ever bound (seen: 9000 leases for 4096
// bindings, after bindings were given back past maxBinds).
// They are appended to ids (the ids an answer already carries), each once.
func (s *Service) givenBack(lc *leaseChan, ids []uint64, gone []*boundDest) []uint64 {
	for _, b := range gone {
		if !slices.Contains(ids, b.id) {
			ids = append(ids, b.id)
		}
		if !slices.Contains(ids, b.desc.Export) && !s.imports.leasedVia(lc, b.desc.Export) {
			ids = append(ids, b.desc.Export)
		}
	}
	return ids
}

// through reports whether a binding, or an ask for one, goes through lc.
func (bc *bindCache) through(lc *leaseChan) bool {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	for _, b := range bc.m {
		if b.lc == lc {
			return true
		}
	}
	for _, via := range bc.pending {
		if via == lc {
			return true
		}
	}
	return false
}

// len is the number of bindings held.
func (bc *bindCache) len() int {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	return len(bc.m)
}

// boundPaths are the destination paths of an in-place copy of srcs to
// remotePath that bindings could serve, one per descriptor (a call's lines
// go rooted at "/", each descriptor naming its tensor by Rel): every
// descriptor in place, from a source that writes into imports. ok=false
// otherwise.
func boundPaths(remotePath string, srcs []Source, metas []Meta, isDir bool) (paths []string, ok bool) {
	if len(srcs) == 0 || len(srcs) != len(metas) {
		return nil, false
	}
	paths = make([]string, len(metas))
	for i, m := range metas {
		if !m.InPlace {
			return nil, false
		}
		if _, ok := srcs[i].(MappingSource); !ok {
			return nil, false
		}
		p := remotePath
		if isDir || m.Rel != "" {
			var err error
			if p, err = CleanPath(strings.TrimSuffix(remotePath, "/") + "/" + m.Rel); err != nil {
				return nil, false
			}
		}
		paths[i] = p
	}
	return paths, true
}

// askBind asks the peer of lc, when it binds, for a binding of path, unless
// one is held, asked or lately refused. The answer comes on lc
// (installBound).
func (s *Service) askBind(lc *leaseChan, path string) {
	if lc == nil || !lc.c.binds || !lc.alive() {
		return
	}
	k := bindKey{lc.instance, path}
	bc := &s.binds
	bc.mu.Lock()
	bc.init()
	if bc.m[k] != nil || bc.pending[k] != nil {
		bc.mu.Unlock()
		return
	}
	if t, ok := bc.refused[k]; ok {
		if time.Since(t) < refuseFor {
			bc.mu.Unlock()
			return
		}
		delete(bc.refused, k)
	}
	bc.pending[k] = lc
	bc.mu.Unlock()
	lc.touch()
	lc.wmu.Lock()
	err := lc.c.sendJSON(frameBind, bindMsg{Path: path, Kinds: s.importKinds()})
	lc.wmu.Unlock()
	if err != nil {
		lc.close(fmt.Errorf("send: %v", err))
	}
}

// installBound takes the answer to askBind (on lc's reader, so that it is
// in place before any revocation of it that follows on lc).
func (s *Service) installBound(lc *leaseChan, m boundMsg) {
	k := bindKey{lc.instance, m.Path}
	bc := &s.binds
	bc.mu.Lock()
	bc.init()
	delete(bc.pending, k)
	if m.Err != "" || m.ID&bindIDBit == 0 {
		bc.refused[k] = time.Now()
		if len(bc.refused) > maxBinds {
			for rk, t := range bc.refused {
				if time.Since(t) >= refuseFor {
					delete(bc.refused, rk)
				}
			}
		}
		bc.mu.Unlock()
		return
	}
	if !lc.alive() {
		// Its end dropped this channel's bindings already (finish closes
		// done before dropChan takes bc.mu): one put in now would outlive
		// the leases the peer has let go.
		bc.mu.Unlock()
		return
	}
	b := &boundDest{key: k, id: m.ID, lc: lc, desc: m.IPC, nbytes: m.NBytes, device: m.Device}
	var evict []*boundDest
	if old := bc.m[k]; old != nil {
		evict = append(evict, old)
	}
	bc.clock++
	b.used = bc.clock
	bc.m[k] = b
	if n := len(bc.m) - maxBinds; n > 0 {
		all := make([]*boundDest, 0, len(bc.m))
		for _, x := range bc.m {
			if x != b {
				all = append(all, x)
			}
		}
		slices.SortFunc(all, func(a, b *boundDest) int { return cmp.Compare(a.used, b.used) })
		evict = append(evict, all[:min(n, len(all))]...)
	}
	for _, x := range evict {
		if bc.m[x.key] == x {
			delete(bc.m, x.key)
		}
	}
	bc.mu.Unlock()
	if len(evict) > 0 {
		// Given back once their writes have landed; not on the reader.
		go func() {
			for _, x := range evict {
				x.kill()
				x.lc.sendIDs(frameRevoked, s.givenBack(x.lc, nil, []*boundDest{x}))
			}
		}()
	}
}

// serveBind answers a peer's bindMsg on lc.
func (s *Service) serveBind(lc *leaseChan, m bindMsg) {
	out := boundMsg{Path: m.Path}
	var g Grant
	var err error
	binder, ok := s.local.(Binder)
	path, perr := CleanPath(m.Path)
	switch {
	case perr != nil:
		err = perr
	case !ok:
		err = &Error{Errno: syscall.EOPNOTSUPP, Msg: "this node binds nothing"}
	default:
		g, err = binder.Bind(path, "peer "+lc.peer, func(h string) bool { return slices.Contains(m.Kinds, handleKind(h)) })
	}
	// Under the writer's lock from the leases' hold to the answer: a
	// revocation of either goes out after the answer.
	lc.wmu.Lock()
	if err == nil {
		id := s.bindIDs.Add(1) | bindIDBit
		switch {
		case !lc.hold(g.Desc.Export, g.ExportLease):
			g.ExportLease.Release()
			g.Lease.Release()
			err = errors.New("lease channel ended")
		case !lc.hold(id, g.Lease):
			g.Lease.Release()
			err = errors.New("lease channel ended")
		default:
			out.ID, out.NBytes, out.Device, out.IPC = id, g.NBytes, g.Device, g.Desc
		}
	}
	if err != nil {
		out.Err = err.Error()
		slog.Debug("bind refused", "peer", lc.peer, "path", m.Path, "err", err)
	}
	lc.touch()
	serr := lc.c.sendJSON(frameBound, out)
	lc.wmu.Unlock()
	if serr != nil {
		lc.close(fmt.Errorf("send: %v", serr))
		return
	}
	if out.ID != 0 {
		// The export's lease may have ended between the hold and the
		// answer (the asker gave back a lease on it, crossing this): it
		// is revoked again then, as after a copy (afterCopy).
		lc.afterCopy(out.IPC.Export)
	}
}

// pushBound is Send's one-sided in-place copy, when the peer of c bound
// every destination of it to this node (bindCache). ok=false: not all
// bound, or not a copy a binding serves (a range outside the size it was
// given, another kind of memory, an import that cannot be had): the copy
// goes two-sided, and the peer answers for it.
func (s *Service) pushBound(ctx context.Context, c *conn, remotePath string, srcs []Source, metas []Meta, isDir bool, label, dst string) (n int, ok bool, err error) {
	paths, can := boundPaths(remotePath, srcs, metas, isDir)
	if !can {
		return 0, false, nil
	}
	bs := make([]*boundDest, len(paths))
	defer func() {
		for _, b := range bs {
			if b != nil {
				b.put()
			}
		}
	}()
	for i, p := range paths {
		b := s.binds.take(c.instance, p)
		if b == nil {
			return 0, false, nil
		}
		bs[i] = b
		m := metas[i]
		ms := srcs[i].(MappingSource)
		if !fitsBound(m, b.nbytes) || (m.Exact && m.NBytes != b.nbytes) || isCUDA(ms.Device()) != isCUDA(b.device) {
			return 0, false, nil
		}
	}
	entries := make([]*importEntry, 0, len(bs))
	defer func() {
		for _, e := range entries {
			s.imports.release(e)
		}
	}()
	for i, b := range bs {
		e, err := s.boundImport(c, b)
		if err != nil {
			slog.Debug("bound import failed; copying two-sided", "peer", c.peer, "path", paths[i], "err", err)
			return 0, false, nil
		}
		entries = append(entries, e)
		if !srcs[i].(MappingSource).Writes(e.m) {
			return 0, false, nil
		}
	}
	for _, b := range bs {
		if !b.lc.alive() {
			return 0, false, nil // its end drops b: two-sided, and the peer answers
		}
	}
	rec, end := s.TrackCtx(ctx, label, dst, "ipc", metas)
	for i, b := range bs {
		m, ms, e := metas[i], srcs[i].(MappingSource), entries[i]
		piece := max(m.NBytes, 1)
		if !isCUDA(ms.Device()) {
			// Host memory moves at a few GB/s a core: in pieces, so that
			// progress shows (a GPU's GiB takes half a millisecond).
			piece = progressPiece
		}
		base := b.desc.Offset
		for off := int64(0); off < m.NBytes && err == nil; off += piece {
			k := min(piece, m.NBytes-off)
			if err = ms.CopyToMapping(e.m, base, base+b.nbytes, off, k); err == nil {
				rec.BytesDone.Add(k)
			}
		}
		if err != nil {
			break
		}
		if !b.lc.alive() {
			// The peer went away meanwhile (its lease channel ended): its
			// tensor may be gone with it.
			err = &Error{Errno: syscall.ECONNRESET, Msg: fmt.Sprintf("%s went away during the copy", c.peer)}
			break
		}
		n++
	}
	end(err)
	return n, true, err
}

// fitsBound reports whether every destination byte of m lies in a tensor
// of nbytes.
func fitsBound(m Meta, nbytes int64) bool {
	if m.Spans == nil {
		return m.Off >= 0 && m.NBytes >= 0 && m.Off <= nbytes-m.NBytes
	}
	for i := range m.Spans {
		sp := &m.Spans[i]
		if sp.Dst < 0 || sp.N < 0 || sp.Dst > nbytes-sp.N {
			return false
		}
	}
	return true
}

func isCUDA(device string) bool { return strings.HasPrefix(device, "cuda") }

// boundImport returns b's import with one more user (release it): the
// one a first copy opened, as long as the import cache keeps it under the
// export's lease (an import opened again after the cache gave the lease
// back would write into memory the peer may have freed: the binding ends
// then).
func (s *Service) boundImport(c *conn, b *boundDest) (*importEntry, error) {
	b.mu.Lock()
	e := b.entry
	b.mu.Unlock()
	if e != nil {
		if s.imports.reacquire(e, b.desc.Export) {
			return e, nil
		}
		// Given back once the writes in flight have landed.
		go func() {
			if gone := s.binds.drop(func(x *boundDest) bool { return x == b }, nil, false); len(gone) > 0 {
				b.lc.sendIDs(frameRevoked, s.givenBack(b.lc, nil, gone))
			}
		}()
		return nil, errors.New("import no longer leased")
	}
	write := handleKind(b.desc.Handle) == "memfd"
	e, err := s.imports.acquireKey(importKey{instance: c.instance, alloc: b.desc.Alloc, write: write}, b.desc, b.lc, func(h string) (Mapping, error) {
		if handleKind(h) == "memfd" {
			if err := checkOwner(c, h); err != nil {
				return nil, err
			}
		}
		return s.openHandleFor(h, write)
	})
	if err != nil {
		return nil, err
	}
	if !s.imports.leased(e, b.desc.Export) {
		// The channel ended meanwhile: the peer no longer holds the
		// export for this node.
		s.imports.release(e)
		return nil, errors.New("import not leased")
	}
	b.mu.Lock()
	if b.entry == nil {
		b.entry = e
	}
	b.mu.Unlock()
	return e, nil
}
