package transfer

import (
	"bufio"
	"encoding/json"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeMapping counts its closes.
type fakeMapping struct {
	handle string
	closed *atomic.Int32
}

func (m fakeMapping) ReadAt(p []byte, off int64) (int, error) { return len(p), nil }
func (m fakeMapping) Close() error                            { m.closed.Add(1); return nil }

func testChan() *leaseChan {
	return &leaseChan{done: make(chan struct{}), held: map[uint64]*heldLease{}}
}

// TestImportCacheKeyedByAllocation: two allocations behind the same handle
// (a recycled memfd, a CUDA address reused after a free) are two imports,
// never one: the cache is keyed by (exporter instance, allocation id).
func TestImportCacheKeyedByAllocation(t *testing.T) {
	ic := newImportCache()
	var opens, closes atomic.Int32
	open := func(h string) (Mapping, error) { opens.Add(1); return fakeMapping{h, &closes}, nil }
	lc := testChan()
	e1, err := ic.acquire("X", IPCDesc{Handle: "memfd:/proc/1/fd/9", Alloc: 1, Export: 10, Leased: true}, lc, open)
	require.NoError(t, err)
	ic.release(e1)
	require.Equal(t, 1, ic.len(), "kept: leased")
	e2, err := ic.acquire("X", IPCDesc{Handle: "memfd:/proc/1/fd/9", Alloc: 2, Export: 11, Leased: true}, lc, open)
	require.NoError(t, err)
	require.NotSame(t, e1, e2)
	ic.release(e2)
	e3, err := ic.acquire("Y", IPCDesc{Handle: "memfd:/proc/1/fd/9", Alloc: 1, Export: 10, Leased: true}, lc, open)
	require.NoError(t, err)
	require.NotSame(t, e1, e3, "another exporter instance (a restart) is another import")
	ic.release(e3)
	require.EqualValues(t, 3, opens.Load())
	require.EqualValues(t, 3, ic.misses.Load())

	// A hit: the same allocation again.
	e4, err := ic.acquire("X", IPCDesc{Handle: "memfd:/proc/1/fd/9", Alloc: 1, Export: 10, Leased: true}, lc, open)
	require.NoError(t, err)
	require.Same(t, e1, e4)
	ic.release(e4)
	require.EqualValues(t, 1, ic.hits.Load())

	ic.revoke(lc, []uint64{10})
	require.Equal(t, 1, ic.len(), "X/1 and Y/1 were leased on export 10, X/2 on 11")
	ic.revoke(lc, []uint64{11})
	require.Zero(t, ic.len())
	require.EqualValues(t, 3, closes.Load())
}

// TestImportCacheUnleasedClosesAfterCopy: without a lease (no channel to hear
// revocations on) an import lives only for the copy.
func TestImportCacheUnleasedClosesAfterCopy(t *testing.T) {
	ic := newImportCache()
	var closes atomic.Int32
	open := func(h string) (Mapping, error) { return fakeMapping{h, &closes}, nil }
	e, err := ic.acquire("X", IPCDesc{Handle: "h", Alloc: 1, Export: 1, Leased: true}, nil, open)
	require.NoError(t, err)
	ic.release(e)
	require.Zero(t, ic.len())
	dead := testChan()
	close(dead.done)
	e, err = ic.acquire("X", IPCDesc{Handle: "h", Alloc: 1, Export: 1, Leased: true}, dead, open)
	require.NoError(t, err)
	ic.release(e)
	require.Zero(t, ic.len(), "a lease on an ended channel does not keep an import")
	require.EqualValues(t, 2, closes.Load())
}

// TestImportCacheRevokeWaitsForCopy: a revocation answered while a copy
// still reads the import would let the exporter free memory under it; the
// answer waits for the copy's release.
func TestImportCacheRevokeWaitsForCopy(t *testing.T) {
	ic := newImportCache()
	var closes atomic.Int32
	open := func(h string) (Mapping, error) { return fakeMapping{h, &closes}, nil }
	lc := testChan()
	e, err := ic.acquire("X", IPCDesc{Handle: "h", Alloc: 1, Export: 1, Leased: true}, lc, open)
	require.NoError(t, err)
	revoked := make(chan struct{})
	go func() { ic.revoke(lc, []uint64{1}); close(revoked) }()
	select {
	case <-revoked:
		t.Fatal("revoke returned while a copy used the import")
	case <-time.After(100 * time.Millisecond):
	}
	require.Zero(t, closes.Load())
	ic.release(e)
	<-revoked
	require.EqualValues(t, 1, closes.Load())
	require.Zero(t, ic.len())
}

// TestImportCacheDropChan: a channel's end drops what was leased through
// it, and only that.
func TestImportCacheDropChan(t *testing.T) {
	ic := newImportCache()
	var closes atomic.Int32
	open := func(h string) (Mapping, error) { return fakeMapping{h, &closes}, nil }
	l1, l2 := testChan(), testChan()
	e1, _ := ic.acquire("X", IPCDesc{Handle: "h", Alloc: 1, Export: 1, Leased: true}, l1, open)
	e2, _ := ic.acquire("Y", IPCDesc{Handle: "h", Alloc: 1, Export: 1, Leased: true}, l2, open)
	ic.release(e1)
	ic.release(e2)
	require.Equal(t, 1, ic.dropChan(l1))
	require.Equal(t, 1, ic.len())
	require.EqualValues(t, 1, closes.Load())
	ic.closeAll()
	require.Zero(t, ic.len())
}

// TestImportCacheOpenFailure: a failed open is not cached; every waiter sees
// the error.
func TestImportCacheOpenFailure(t *testing.T) {
	ic := newImportCache()
	boom := errors.New("boom")
	_, err := ic.acquire("X", IPCDesc{Handle: "h", Alloc: 1}, nil, func(string) (Mapping, error) { return nil, boom })
	require.ErrorIs(t, err, boom)
	require.Zero(t, ic.len())
}

// TestImportCacheEvictsAndGivesBack: past its bound the cache closes the
// least recently used idle import and gives its lease back to the exporter
// (frameRevoked, unasked).
func TestImportCacheEvictsAndGivesBack(t *testing.T) {
	ic := newImportCache()
	ic.max = 2
	var closes atomic.Int32
	open := func(h string) (Mapping, error) { return fakeMapping{h, &closes}, nil }
	near, far := net.Pipe()
	defer near.Close()
	defer far.Close()
	lc := testChan()
	lc.c = newConn(near, 5*time.Second, "")
	got := make(chan idsMsg, 1)
	go func() {
		typ, p, err := readFrame(bufio.NewReader(far), nil, MaxFrame)
		var m idsMsg
		if err == nil && typ == frameRevoked && json.Unmarshal(p, &m) == nil {
			got <- m
		}
		close(got)
	}()
	// 1, 2, then 1 again: 2 is the least recently used when 3 comes.
	for _, alloc := range []uint64{1, 2, 1, 3} {
		e, err := ic.acquire("X", IPCDesc{Handle: "h", Alloc: alloc, Export: 100 + alloc, Leased: true}, lc, open)
		require.NoError(t, err)
		ic.release(e)
	}
	require.Equal(t, 2, ic.len())
	require.EqualValues(t, 1, closes.Load())
	m, ok := <-got
	require.True(t, ok, "the lease was given back")
	require.Equal(t, []uint64{102}, m.IDs)
}
