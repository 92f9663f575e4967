// Package ipc records IPC exports (the handle another process opens to map a
// tensor's memory without a copy: a CUDA IPC handle or a host memfd path) and the
// leases importers hold on them. An export's id is never reused. Revoking an
// export notifies every lease holder, waits (bounded) for them to let go, and only
// then returns, so the caller can free the memory knowing no importer may still
// touch it.
//
// The package knows nothing of FUSE or devices; the Registry is safe for
// concurrent use.
package ipc

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Sentinel errors; match with errors.Is.
var (
	// ErrNotFound: no live export has that id.
	ErrNotFound = errors.New("ipc export not found")
	// ErrRevoked: the export is being revoked; no new leases.
	ErrRevoked = errors.New("ipc export revoked")
)

// Export is one exported range. Its fields never change.
type Export struct {
	// ID is unique for the registry's life, starting at 1, never reused.
	ID uint64
	// Handle opens the whole allocation in another process: "cuda:" + 128 hex
	// digits, or "memfd:/proc/PID/fd/N".
	Handle string
	// AllocID is the exporting daemon's never-reused id of the allocation behind
	// Handle; importers key their caches by it.
	AllocID uint64
	// Offset is the byte offset of the exported range inside the allocation.
	Offset int64
	// Len is the exported range's length in bytes.
	Len int64
}

// Lease is one importer's hold on an export: a peer daemon's (through its
// connection) or a local process's (through an open file handle).
type Lease struct {
	reg     *Registry
	export  *exportEntry
	holder  string
	revoked chan struct{}
	once    sync.Once
}

// Holder names who holds the lease, for logs ("fh pid 1234", "peer nodeB").
func (l *Lease) Holder() string { return l.holder }

// ExportID is the id of the export the lease is on.
func (l *Lease) ExportID() uint64 { return l.export.ID }

// Revoked is closed when the exporter revokes the export: the holder must drop
// its mapping and call Release.
func (l *Lease) Revoked() <-chan struct{} { return l.revoked }

// Release ends the lease. It is safe to call more than once.
func (l *Lease) Release() { l.once.Do(func() { l.reg.release(l) }) }

type exportEntry struct {
	*Export
	leases  map[*Lease]struct{}
	revoked bool
	idle    chan struct{} // closed when revoked and leaseless
}

// Registry holds the live exports and leases of one daemon.
type Registry struct {
	mu      sync.Mutex
	nextID  uint64 // also the number of exports made: ids are never reused
	exports map[uint64]*exportEntry
	leases  int
	// Since start: leases given, revocations done, leases dropped at a
	// revocation's timeout (Totals).
	leased, revoked, dropped uint64
	// onRevoke is called at the end of each Revoke (NewRegistry).
	onRevoke func(wait time.Duration)
}

// NewRegistry returns an empty registry. onRevoke, when not nil, is called
// at the end of every Revoke with how long it waited for the leases to be
// released (up to its timeout; about 0 for an export nobody leased), so
// that the daemon's metrics can show the distribution of those waits, which
// a counter cannot.
func NewRegistry(onRevoke func(wait time.Duration)) *Registry {
	return &Registry{exports: map[uint64]*exportEntry{}, onRevoke: onRevoke}
}

// Export records a new export of [offset, offset+n) of the allocation allocID
// behind handle.
func (r *Registry) Export(handle string, allocID uint64, offset, n int64) *Export {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nextID++
	e := &exportEntry{Export: &Export{ID: r.nextID, Handle: handle, AllocID: allocID, Offset: offset, Len: n}, leases: map[*Lease]struct{}{}}
	r.exports[e.ID] = e
	return e.Export
}

// Lease gives holder a lease on export id. Errors: ErrNotFound, ErrRevoked.
func (r *Registry) Lease(id uint64, holder string) (*Lease, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.exports[id]
	if !ok {
		return nil, fmt.Errorf("lease on ipc %d: %w", id, ErrNotFound)
	}
	if e.revoked {
		return nil, fmt.Errorf("lease on ipc %d: %w", id, ErrRevoked)
	}
	l := &Lease{reg: r, export: e, holder: holder, revoked: make(chan struct{})}
	e.leases[l] = struct{}{}
	r.leases++
	r.leased++
	return l, nil
}

func (r *Registry) release(l *Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := l.export
	if _, ok := e.leases[l]; !ok {
		return
	}
	delete(e.leases, l)
	r.leases--
	if e.revoked && len(e.leases) == 0 {
		close(e.idle)
	}
}

// Revoke ends export id: no new leases, every holder is notified through
// Lease.Revoked, and Revoke waits until all have released or timeout has
// passed; leases still held then are dropped (and logged). When Revoke
// returns, the export is gone. Errors: ErrNotFound (also for a second Revoke).
func (r *Registry) Revoke(id uint64, timeout time.Duration) error {
	r.mu.Lock()
	e, ok := r.exports[id]
	if !ok || e.revoked {
		r.mu.Unlock()
		return fmt.Errorf("revoke ipc %d: %w", id, ErrNotFound)
	}
	e.revoked = true
	r.revoked++
	start := time.Now()
	e.idle = make(chan struct{})
	if len(e.leases) == 0 {
		close(e.idle)
	}
	for l := range e.leases {
		close(l.revoked)
	}
	r.mu.Unlock()

	select {
	case <-e.idle:
	case <-time.After(timeout):
		r.mu.Lock()
		for l := range e.leases {
			slog.Warn("lease not released within the revoke timeout; dropped", "ipc", id, "holder", l.holder, "seconds", timeout.Seconds())
			delete(e.leases, l)
			r.leases--
			r.dropped++
		}
		r.mu.Unlock()
	}
	wait := time.Since(start)
	r.mu.Lock()
	delete(r.exports, id)
	r.mu.Unlock()
	if r.onRevoke != nil {
		r.onRevoke(wait)
	}
	return nil
}

// Leases returns the number of leases held on export id now (an importer
// check: the owner may replace the memory only when nobody holds it).
// Errors: ErrNotFound.
func (r *Registry) Leases(id uint64) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.exports[id]
	if !ok {
		return 0, fmt.Errorf("ipc %d: %w", id, ErrNotFound)
	}
	return len(e.leases), nil
}

// Totals are a registry's counts since it was made.
type Totals struct {
	Exports uint64 // exports made (Export)
	Leases  uint64 // leases given (Lease)
	Revokes uint64 // revocations begun (Revoke)
	Dropped uint64 // leases dropped by a revocation's timeout, not released
}

// Totals returns the counts since the registry was made; they only grow.
func (r *Registry) Totals() Totals {
	r.mu.Lock()
	defer r.mu.Unlock()
	return Totals{Exports: r.nextID, Leases: r.leased, Revokes: r.revoked, Dropped: r.dropped}
}

// Stats returns the number of live exports (including ones being revoked) and
// of leases held.
func (r *Registry) Stats() (exports, leases int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.exports), r.leases
}
