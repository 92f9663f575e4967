package transfer

import (
	"cmp"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
)

// Mapping is an allocation of another daemon of this host, opened here from
// its IPC handle: the import cache's value. Offsets are from the start of
// the allocation.
type Mapping interface {
	ReadAt(p []byte, off int64) (int, error)
	// Close unmaps (closes the fd, cuIpcCloseMemHandle); the memory stays
	// the exporter's.
	Close() error
}

// importKey names an allocation across daemon restarts: the exporter's
// instance id and its never-reused allocation id (a CUDA IPC handle maps
// the whole allocation, so imports are cached per allocation, never per
// address).
type importKey struct {
	instance string
	alloc    uint64
	// write: a host import opened for writing (a one-sided copy's, into a
	// peer's memfd); a copy's reads map it read-only.
	write bool
}

// importEntry is one cached import.
type importEntry struct {
	key   importKey
	ready chan struct{} // closed once the open finished (m or err set)
	m     Mapping
	err   error
	refs  int                   // copies using it now
	used  int64                 // the cache's clock at the last acquire, for eviction
	idle  chan struct{}         // closed when refs drops to 0 with no leases
	lease map[uint64]*leaseChan // export ids leased to us on it, and through which channel
}

// importCache holds the imports of this node: kept while an exporter leases
// them, closed when it revokes (or when no lease was given, after the copy).
type importCache struct {
	mu    sync.Mutex
	m     map[importKey]*importEntry
	clock int64
	max   int // imports kept before the least recently used are given back

	hits, misses atomic.Int64
}

// maxImports bounds the import cache: each host import holds an fd, each
// CUDA import a mapping. Past it, the least recently used imports nobody
// is copying from are closed and their leases given back to the exporters.
const maxImports = 4096

func newImportCache() *importCache {
	return &importCache{m: map[importKey]*importEntry{}, max: maxImports}
}

// len is the number of live imports, for stats.
func (ic *importCache) len() int {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	return len(ic.m)
}

// acquire returns the import of the allocation d describes, opening it on a
// miss, and counts one more user of it; lc, when d is leased, is the
// channel the exporter holds the lease on. Users call release.
func (ic *importCache) acquire(instance string, d IPCDesc, lc *leaseChan, open func(handle string) (Mapping, error)) (*importEntry, error) {
	return ic.acquireKey(importKey{instance: instance, alloc: d.Alloc}, d, lc, open)
}

// acquireKey is acquire under key k (importKey.write).
func (ic *importCache) acquireKey(k importKey, d IPCDesc, lc *leaseChan, open func(handle string) (Mapping, error)) (*importEntry, error) {
	ic.mu.Lock()
	ic.clock++
	e := ic.m[k]
	if e != nil {
		e.used = ic.clock
	}
	if e == nil {
		e = &importEntry{key: k, ready: make(chan struct{}), lease: map[uint64]*leaseChan{}, used: ic.clock}
		ic.m[k] = e
		e.refs++
		ic.mu.Unlock()
		ic.misses.Add(1)
		e.m, e.err = open(d.Handle)
		if e.err != nil {
			ic.mu.Lock()
			delete(ic.m, k)
			ic.mu.Unlock()
		}
		close(e.ready)
	} else {
		e.refs++
		ic.mu.Unlock()
		<-e.ready
		if e.err == nil {
			ic.hits.Add(1)
		}
	}
	if e.err != nil {
		return nil, e.err
	}
	if d.Leased && lc != nil {
		ic.mu.Lock()
		lc.mu.Lock()
		// The lease counts only while its channel lives: after the channel's
		// end no revocation could reach us.
		if lc.alive() {
			e.lease[d.Export] = lc
			lc.touch()
		}
		lc.mu.Unlock()
		ic.mu.Unlock()
	}
	return e, nil
}

// reacquire counts one more user of e while the cache still holds it
// under export's lease; false: it does not (the caller must not use it).
func (ic *importCache) reacquire(e *importEntry, export uint64) bool {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if ic.m[e.key] != e || e.lease[export] == nil || e.err != nil {
		return false
	}
	ic.clock++
	e.used = ic.clock
	e.refs++
	ic.hits.Add(1)
	return true
}

// leased reports whether e holds export's lease.
func (ic *importCache) leased(e *importEntry, export uint64) bool {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	return e.lease[export] != nil
}

// leasedVia reports whether an import holds export's lease through lc.
func (ic *importCache) leasedVia(lc *leaseChan, export uint64) bool {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	for _, e := range ic.m {
		if e.lease[export] == lc {
			return true
		}
	}
	return false
}

// leasedThroughLocked reports whether any import is leased through lc.
// ic.mu is held.
func (ic *importCache) leasedThroughLocked(lc *leaseChan) bool {
	for _, e := range ic.m {
		for _, via := range e.lease {
			if via == lc {
				return true
			}
		}
	}
	return false
}

// release ends one use of e; it is closed when nobody uses it and no lease
// keeps it.
func (ic *importCache) release(e *importEntry) {
	ic.mu.Lock()
	e.refs--
	closeIt := e.refs == 0 && len(e.lease) == 0
	if closeIt && ic.m[e.key] == e {
		delete(ic.m, e.key)
	}
	var evicted []*importEntry
	if len(ic.m) > ic.max {
		evicted = ic.evictLocked(len(ic.m) - ic.max)
	}
	ic.mu.Unlock()
	if closeIt {
		ic.closeEntry(e)
	}
	for _, v := range evicted {
		ic.closeEntry(v)
		// The leases, given back; not on this goroutine: a failed send ends
		// the channel, whose end waits for imports this copy may still hold.
		for id, lc := range v.lease {
			go lc.sendIDs(frameRevoked, []uint64{id})
		}
	}
}

// evictLocked takes up to n unused imports out of the cache, least recently
// used first, for the caller to close and give back. ic.mu is held.
func (ic *importCache) evictLocked(n int) []*importEntry {
	var idle []*importEntry
	for _, e := range ic.m {
		select {
		case <-e.ready:
		default:
			continue
		}
		if e.refs == 0 && e.idle == nil {
			idle = append(idle, e)
		}
	}
	slices.SortFunc(idle, func(a, b *importEntry) int { return cmp.Compare(a.used, b.used) })
	idle = idle[:min(n, len(idle))]
	for _, e := range idle {
		delete(ic.m, e.key)
	}
	return idle
}

// closeEntry closes e's mapping (e is out of the map and unused).
func (ic *importCache) closeEntry(e *importEntry) {
	if e.idle != nil {
		close(e.idle)
	}
	if e.m != nil {
		if err := e.m.Close(); err != nil {
			slog.Warn("close import failed", "alloc", e.key.alloc, "instance", e.key.instance, "err", err)
		}
	}
}

// drop removes the leases that match from every entry and closes the
// entries left unused and unleased; it waits for entries still in use by a
// copy to be closed, so that the caller's answer to the exporter comes
// only after the mapping is gone. It returns how many entries it closed.
func (ic *importCache) drop(match func(id uint64, lc *leaseChan) bool) int {
	var closeNow, waitFor []*importEntry
	ic.mu.Lock()
	for k, e := range ic.m {
		had := len(e.lease)
		for id, lc := range e.lease {
			if match(id, lc) {
				delete(e.lease, id)
			}
		}
		if had == 0 || len(e.lease) > 0 {
			continue
		}
		select {
		case <-e.ready:
		default:
			continue // still opening: its opener holds a ref
		}
		if e.refs == 0 {
			delete(ic.m, k)
			closeNow = append(closeNow, e)
		} else {
			// The copy reading it now ends soon (the exporter's pin keeps
			// the memory meanwhile); the mapping closes at its release.
			if e.idle == nil {
				e.idle = make(chan struct{})
			}
			waitFor = append(waitFor, e)
		}
	}
	ic.mu.Unlock()
	for _, e := range closeNow {
		ic.closeEntry(e)
	}
	for _, e := range waitFor {
		<-e.idle
	}
	return len(closeNow) + len(waitFor)
}

// revoke drops the imports of the export ids the peer of lc revokes.
func (ic *importCache) revoke(lc *leaseChan, ids []uint64) {
	set := make(map[uint64]bool, len(ids))
	for _, id := range ids {
		set[id] = true
	}
	ic.drop(func(id uint64, via *leaseChan) bool { return via == lc && set[id] })
}

// dropChan drops every import leased through lc (its channel ended).
func (ic *importCache) dropChan(lc *leaseChan) int {
	return ic.drop(func(_ uint64, via *leaseChan) bool { return via == lc })
}

// closeAll closes every import (at Close); users still running keep theirs
// until they release it.
func (ic *importCache) closeAll() {
	ic.drop(func(uint64, *leaseChan) bool { return true })
}
