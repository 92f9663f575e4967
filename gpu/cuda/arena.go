package cuda

import "sort"

const (
	// ArenaSize is the size in bytes of the allocations small buffers are
	// carved from, and the granularity of every allocation: CUDA allocates
	// and maps device memory in 2 MiB pages, and its per-allocation costs
	// (cuMemAlloc, cuIpcGetMemHandle, an importer's cuIpcOpenMemHandle) do
	// not shrink with the size, so a 64 KiB tensor of its own would cost
	// 2 MiB and a full registration.
	ArenaSize = 2 << 20
	// Align is the alignment in bytes of every buffer inside an arena (its
	// ipc_offset is a multiple of it): cudaMalloc's own guarantee, which
	// kernels written for cudaMalloc'd pointers assume for vector loads.
	Align = 256
)

// allocation is one cuMemAlloc'd range with one IPC handle: either an arena
// shared by the small buffers of one owner, or the single buffer of a large
// tensor.
type allocation struct {
	base   devptr
	size   int64 // bytes, a multiple of ArenaSize
	id     uint64
	handle string // "cuda:" + 128 hex digits
	owner  uint32
	arena  bool
	dev    *Device // the device whose memory it is; nil for an import

	// An import is not memory of this process's allocator: imp is the
	// cuIpcOpenMemHandle mapping it lives in, or alias the allocation of
	// this process it names (Import of a handle this process exported).
	imp   *mapping
	alias *allocation

	// Guarded by exports' lock: buffers imported from this allocation by
	// this process (aliases) not yet freed, and whether its owner freed it
	// meanwhile (cuMemFree then waits for the last alias).
	pins int
	dead bool

	// Arena bookkeeping, guarded by Device.amu.
	free    []extent // free ranges: sorted by off, disjoint, never adjacent
	inUse   int64    // bytes handed out
	pidx    int      // index in its pool's partial list, -1 when it has no free extent
	idleGen uint64   // bumped each time it becomes its pool's idle arena
}

// extent is a free range of an arena, in bytes from its base.
type extent struct{ off, n int64 }

// take carves n bytes (a multiple of Align) first-fit, which keeps the tail
// of the arena free for larger requests.
func (a *allocation) take(n int64) (off int64, ok bool) {
	for i, e := range a.free {
		if e.n < n {
			continue
		}
		off = e.off
		if e.n == n {
			a.free = append(a.free[:i], a.free[i+1:]...)
		} else {
			a.free[i] = extent{e.off + n, e.n - n}
		}
		a.inUse += n
		return off, true
	}
	return 0, false
}

// give returns [off, off+n) to the free list, merging it with free
// neighbours so that an arena whose buffers are all freed is one extent again.
func (a *allocation) give(off, n int64) {
	a.inUse -= n
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off > off })
	mergePrev := i > 0 && a.free[i-1].off+a.free[i-1].n == off
	mergeNext := i < len(a.free) && off+n == a.free[i].off
	switch {
	case mergePrev && mergeNext:
		a.free[i-1].n += n + a.free[i].n
		a.free = append(a.free[:i], a.free[i+1:]...)
	case mergePrev:
		a.free[i-1].n += n
	case mergeNext:
		a.free[i] = extent{off, n + a.free[i].n}
	default:
		a.free = append(a.free, extent{})
		copy(a.free[i+1:], a.free[i:])
		a.free[i] = extent{off, n}
	}
}

// pool is one owner's arenas that still have free space. Full arenas are
// kept only by their buffers, so a search never walks them.
type pool struct {
	partial []*allocation
	// idle is an empty arena kept for a while (Device.linger) in case the
	// owner allocates again soon: a create/unlink loop would otherwise pay
	// cuMemAlloc, cuIpcGetMemHandle and cuMemFree for every tensor.
	idle *allocation
}

// pools sub-allocates small buffers, one pool per owner uid: an IPC handle
// maps a whole arena, so tensors of different owners never share one.
// Not safe for concurrent use (the Device holds amu).
type pools map[uint32]*pool

// take carves n bytes for owner from an arena that has room, or returns nil.
// The idle arena is the last resort, so that it can still expire when the
// owner's other arenas have room.
func (ps pools) take(owner uint32, n int64) (*allocation, int64) {
	p := ps[owner]
	if p == nil {
		return nil, 0
	}
	for _, a := range p.partial {
		if a != p.idle {
			if off, ok := a.take(n); ok {
				p.took(a)
				return a, off
			}
		}
	}
	if a := p.idle; a != nil {
		if off, ok := a.take(n); ok {
			p.idle = nil // in use again
			p.took(a)
			return a, off
		}
	}
	return nil, 0
}

// took moves an arena that was just carved from out of the partial list
// when it has no room left.
func (p *pool) took(a *allocation) {
	if len(a.free) == 0 {
		p.remove(a)
	}
}

// add puts a new, wholly free arena in its owner's pool.
func (ps pools) add(a *allocation) {
	a.free = []extent{{0, a.size}}
	a.inUse = 0
	a.pidx = -1
	ps.get(a.owner).insert(a)
}

// get returns owner's pool, making it when the owner has none.
func (ps pools) get(owner uint32) *pool {
	p := ps[owner]
	if p == nil {
		p = &pool{}
		ps[owner] = p
	}
	return p
}

// give returns a buffer's bytes to its arena, reporting whether the arena
// is now empty; an empty arena stays in the pool until drop (or a take).
func (ps pools) give(a *allocation, off, n int64) (empty bool) {
	p := ps.get(a.owner) // a full arena's owner may have no pool left
	a.give(off, n)
	if a.pidx < 0 {
		p.insert(a)
	}
	return a.inUse == 0
}

// drop takes an empty arena out of its pool, for the caller to free.
func (ps pools) drop(a *allocation) {
	p := ps[a.owner]
	if p == nil {
		return
	}
	if a.pidx >= 0 {
		p.remove(a)
	}
	if p.idle == a {
		p.idle = nil
	}
	if len(p.partial) == 0 {
		delete(ps, a.owner)
	}
}

func (p *pool) insert(a *allocation) {
	a.pidx = len(p.partial)
	p.partial = append(p.partial, a)
}

// remove takes a out of the partial list in O(1), by swapping the last one in.
func (p *pool) remove(a *allocation) {
	last := p.partial[len(p.partial)-1]
	p.partial[a.pidx] = last
	last.pidx = a.pidx
	p.partial = p.partial[:len(p.partial)-1]
	a.pidx = -1
}
