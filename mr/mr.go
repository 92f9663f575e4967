// Package mr is the memory-region registry: every range of device memory that
// tensorfs exposes for transfer is registered here as a memory region (MR) with an
// id that is never reused, and, when a transport maps memory (a Mapper: UCX's
// ucp_mem_map), the packed rkey peers reach it by (UCX's own bytes; a home-made
// random key would grant nothing). Any (addr, len) inside a region
// resolves to it through an interval index, so views and slices of a tensor find
// their MR. Pins keep a region alive while a transfer uses it: deregistration
// removes the region from lookups at once, but its release callback (which frees
// the memory) runs only after the last pin is dropped.
//
// The package knows nothing of FUSE or devices; the Registry is safe for
// concurrent use.
package mr

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
)

// Sentinel errors; match with errors.Is.
var (
	// ErrNotFound: no live region has that id, or contains that range.
	ErrNotFound = errors.New("memory region not found")
	// ErrOverlap: the range overlaps a region that is already registered.
	ErrOverlap = errors.New("memory region overlaps a registered one")
	// ErrInvalid: a zero length or a range that wraps the address space.
	ErrInvalid = errors.New("invalid memory region")
)

// Region is one registered memory region. Its fields never change after
// Register.
type Region struct {
	// ID is unique for the registry's life, starting at 1, never reused.
	ID uint64
	// Device names the device the memory lives on ("host", "cuda:0").
	Device string
	// Addr is the region's first byte in the device's address space.
	Addr uintptr
	// Len is the region's length in bytes (> 0).
	Len uint64
	// Rkey is the packed remote key of the region's mapping for a network
	// transport (the Registry's Mapper: UCX's ucp_rkey_pack bytes), which
	// peers use to reach it; nil when no transport maps it.
	Rkey []byte
}

// Mapper maps memory regions for a network transport for exactly their
// registered lifetime (UCX's ucp_mem_map: issue 17): Map runs in Register,
// before the region is visible; the unmap it returns runs once the region
// is deregistered and unpinned, before the release callback frees the
// memory. Map returns (nil, nil, nil) for memory the transport does not
// map (device memory a UCX without CUDA support cannot register); an
// error fails the registration. It must not call the Registry.
type Mapper interface {
	Map(device string, addr uintptr, length uint64) (rkey []byte, unmap func(), err error)
}

// Contains reports whether [addr, addr+n) lies inside the region.
func (r *Region) Contains(addr uintptr, n uint64) bool {
	return addr >= r.Addr && n <= r.Len && uint64(addr-r.Addr) <= r.Len-n
}

type entry struct {
	*Region
	shared   bool // may overlap other shared regions (RegisterShared)
	pins     int
	dead     bool   // deregistered; no new pins
	released func() // runs once, when dead and unpinned
	unmap    func() // the Mapper's, run before released; nil: not mapped
}

// Registry holds the live regions of one daemon.
type Registry struct {
	mu     sync.Mutex
	nextID uint64
	byID   map[uint64]*entry
	// byAddr holds the live regions of each device sorted by Addr; they never
	// overlap, so a binary search finds the only candidate for a lookup.
	byAddr map[string][]*entry
	// shared holds each device's regions of memory tensorfs did not
	// allocate (RegisterShared), which may overlap one another: two files
	// registered over the same foreign memory, as two ibv_reg_mr calls on
	// one buffer give two MRs.
	shared map[string][]*entry
	pins   int
	mapper Mapper // nil: regions are not mapped for a transport
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{byID: map[uint64]*entry{}, byAddr: map[string][]*entry{}, shared: map[string][]*entry{}}
}

// SetMapper makes every region registered from now on mapped by m for its
// lifetime (see Mapper); call it before the first Register.
func (r *Registry) SetMapper(m Mapper) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mapper = m
}

// Register records [addr, addr+length) on device as a new region. Errors:
// ErrInvalid for length 0 or a wrapping range, ErrOverlap when the range overlaps
// a live region of the same device.
func (r *Registry) Register(device string, addr uintptr, length uint64) (*Region, error) {
	return r.register(device, addr, length, false)
}

// RegisterShared records [addr, addr+length) on device as a new region of
// memory tensorfs did not allocate (manual registration): it may overlap
// other shared regions, never one from Register (tensorfs's own memory and
// imported memory never share addresses). Errors: ErrInvalid for length 0
// or a wrapping range, ErrOverlap when it overlaps a Register region.
func (r *Registry) RegisterShared(device string, addr uintptr, length uint64) (*Region, error) {
	return r.register(device, addr, length, true)
}

func (r *Registry) register(device string, addr uintptr, length uint64, shared bool) (*Region, error) {
	if length == 0 || uint64(addr)+length < uint64(addr) {
		return nil, fmt.Errorf("register [%#x, +%d): %w", addr, length, ErrInvalid)
	}
	// The mapping is made outside the lock (a transport's registration
	// of the pages can take a while) and undone if the region cannot be.
	r.mu.Lock()
	m := r.mapper
	r.mu.Unlock()
	var rkey []byte
	var unmap func()
	if m != nil {
		var err error
		if rkey, unmap, err = m.Map(device, addr, length); err != nil {
			return nil, fmt.Errorf("register [%#x, +%d) on %s: map for the transport: %w", addr, length, device, err)
		}
	}
	region, err := r.insert(device, addr, length, shared, rkey, unmap)
	if err != nil && unmap != nil {
		unmap()
	}
	return region, err
}

// insert adds the region to the indexes.
func (r *Registry) insert(device string, addr uintptr, length uint64, shared bool, rkey []byte, unmap func()) (*Region, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	list := r.byAddr[device]
	i := sort.Search(len(list), func(i int) bool { return list[i].Addr >= addr })
	if i < len(list) && uint64(list[i].Addr) < uint64(addr)+length {
		return nil, fmt.Errorf("register [%#x, +%d) on %s: %w (mr %d)", addr, length, device, ErrOverlap, list[i].ID)
	}
	if i > 0 && uint64(list[i-1].Addr)+list[i-1].Len > uint64(addr) {
		return nil, fmt.Errorf("register [%#x, +%d) on %s: %w (mr %d)", addr, length, device, ErrOverlap, list[i-1].ID)
	}
	r.nextID++
	e := &entry{Region: &Region{ID: r.nextID, Device: device, Addr: addr, Len: length, Rkey: rkey}, shared: shared, unmap: unmap}
	if shared {
		r.shared[device] = append(r.shared[device], e)
	} else {
		list = slices.Insert(list, i, e)
		r.byAddr[device] = list
	}
	r.byID[e.ID] = e
	return e.Region, nil
}

// Lookup returns the live region of device that contains [addr, addr+n), or
// ErrNotFound. It is the interval index the spec promises: nothing in the
// daemon resolves an address to its region yet, because every copy today
// names whole tensors; the in-place copies (ranges and descriptor lists of
// (tensor, offset, length)) resolve and pin each descriptor's region through
// it, which is why it stays.
func (r *Registry) Lookup(device string, addr uintptr, n uint64) (*Region, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	list := r.byAddr[device]
	// The candidate is the last region starting at or before addr.
	i := sort.Search(len(list), func(i int) bool { return list[i].Addr > addr }) - 1
	if i >= 0 && list[i].Contains(addr, n) {
		return list[i].Region, nil
	}
	for _, e := range r.shared[device] {
		if e.Contains(addr, n) {
			return e.Region, nil
		}
	}
	return nil, fmt.Errorf("[%#x, +%d) on %s: %w", addr, n, device, ErrNotFound)
}

// Pin keeps region id from being released until the returned unpin is called
// (exactly once; later calls do nothing). Errors: ErrNotFound when the region is
// unknown or already deregistered.
func (r *Registry) Pin(id uint64) (unpin func(), err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.byID[id]
	if !ok || e.dead {
		return nil, fmt.Errorf("pin mr %d: %w", id, ErrNotFound)
	}
	e.pins++
	r.pins++
	var once sync.Once
	return func() { once.Do(func() { r.unpin(e) }) }, nil
}

func (r *Registry) unpin(e *entry) {
	r.mu.Lock()
	e.pins--
	r.pins--
	var release func()
	if e.dead && e.pins == 0 {
		release = r.drop(e)
	}
	r.mu.Unlock()
	if release != nil {
		release()
	}
}

// Deregister removes region id from lookups at once and calls released (may be
// nil) when no pin holds it any more: immediately, on this goroutine, if it is
// unpinned, else from the last unpin. Errors: ErrNotFound.
func (r *Registry) Deregister(id uint64, released func()) error {
	r.mu.Lock()
	e, ok := r.byID[id]
	if !ok || e.dead {
		r.mu.Unlock()
		return fmt.Errorf("deregister mr %d: %w", id, ErrNotFound)
	}
	e.dead = true
	e.released = released
	if e.shared {
		list := r.shared[e.Device]
		i := slices.Index(list, e)
		r.shared[e.Device] = slices.Delete(list, i, i+1)
		if len(r.shared[e.Device]) == 0 {
			delete(r.shared, e.Device)
		}
	} else {
		list := r.byAddr[e.Device]
		i := sort.Search(len(list), func(i int) bool { return list[i].Addr >= e.Addr })
		r.byAddr[e.Device] = append(list[:i], list[i+1:]...)
		if len(r.byAddr[e.Device]) == 0 {
			delete(r.byAddr, e.Device)
		}
	}
	var release func()
	if e.pins == 0 {
		release = r.drop(e)
	}
	r.mu.Unlock()
	if release != nil {
		release()
	}
	return nil
}

// drop forgets a dead, unpinned entry and returns what is left to run:
// its unmap, then its release callback. r.mu is held.
func (r *Registry) drop(e *entry) func() {
	delete(r.byID, e.ID)
	f, unmap := e.released, e.unmap
	e.released, e.unmap = nil, nil
	if unmap == nil {
		return f
	}
	return func() {
		unmap()
		if f != nil {
			f()
		}
	}
}

// Registered returns the number of regions registered since the registry
// was made (ids are never reused, so it is the last id given).
func (r *Registry) Registered() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nextID
}

// Stats returns the number of regions not yet released (live, or deregistered
// but still pinned) and the number of pins held.
func (r *Registry) Stats() (regions, pins int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byID), r.pins
}
