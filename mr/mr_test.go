package mr

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRegisterLookup(t *testing.T) {
	r := NewRegistry()
	a, err := r.Register("host", 0x1000, 0x1000)
	require.NoError(t, err)
	b, err := r.Register("host", 0x3000, 0x100)
	require.NoError(t, err)
	c, err := r.Register("cuda:0", 0x1000, 0x1000) // same address, other device
	require.NoError(t, err)
	require.NotEqual(t, a.ID, b.ID)
	require.NotEqual(t, a.ID, c.ID)

	for _, tc := range []struct {
		dev  string
		addr uintptr
		n    uint64
		want *Region
	}{
		{"host", 0x1000, 1, a},
		{"host", 0x1800, 0x800, a}, // a slice ending at the region's end
		{"host", 0x1fff, 1, a},
		{"host", 0x3000, 0x100, b},
		{"cuda:0", 0x1800, 8, c},
	} {
		got, err := r.Lookup(tc.dev, tc.addr, tc.n)
		require.NoError(t, err, "%+v", tc)
		require.Equal(t, tc.want.ID, got.ID)
	}
	for _, tc := range []struct {
		addr uintptr
		n    uint64
	}{{0xfff, 2}, {0x1800, 0x801}, {0x2000, 1}, {0x30ff, 2}, {0x5000, 1}} {
		_, err := r.Lookup("host", tc.addr, tc.n)
		require.ErrorIs(t, err, ErrNotFound, "%+v", tc)
	}
}

func TestRegisterRejectsOverlapAndEmpty(t *testing.T) {
	r := NewRegistry()
	_, err := r.Register("host", 0x1000, 0x1000)
	require.NoError(t, err)
	for _, rg := range [][2]uint64{{0x800, 0x801}, {0x1fff, 1}, {0x1800, 0x10}, {0x0, 0x10000}} {
		_, err := r.Register("host", uintptr(rg[0]), rg[1])
		require.ErrorIs(t, err, ErrOverlap, "%x", rg)
	}
	_, err = r.Register("host", 0x9000, 0)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = r.Register("host", ^uintptr(0)-1, 4)
	require.ErrorIs(t, err, ErrInvalid)
	// Adjacent ranges are fine.
	_, err = r.Register("host", 0x2000, 0x10)
	require.NoError(t, err)
	_, err = r.Register("host", 0x800, 0x800)
	require.NoError(t, err)
}

func TestIDsNeverReused(t *testing.T) {
	r := NewRegistry()
	seen := map[uint64]bool{}
	for i := 0; i < 100; i++ {
		g, err := r.Register("host", 0x1000, 64)
		require.NoError(t, err)
		require.False(t, seen[g.ID], "id %d reused", g.ID)
		seen[g.ID] = true
		require.NoError(t, r.Deregister(g.ID, nil))
	}
}

func TestPinDelaysRelease(t *testing.T) {
	r := NewRegistry()
	g, err := r.Register("host", 0x1000, 64)
	require.NoError(t, err)
	unpin, err := r.Pin(g.ID)
	require.NoError(t, err)
	released := false
	require.NoError(t, r.Deregister(g.ID, func() { released = true }))
	require.False(t, released, "released while pinned")
	_, err = r.Lookup("host", 0x1000, 1)
	require.ErrorIs(t, err, ErrNotFound, "a deregistered region must not resolve")
	_, err = r.Pin(g.ID)
	require.ErrorIs(t, err, ErrNotFound, "no new pins after deregistration")
	// The address range is free for a new region while the old one drains.
	_, err = r.Register("host", 0x1000, 64)
	require.NoError(t, err)
	regions, pins := r.Stats()
	require.Equal(t, 2, regions)
	require.Equal(t, 1, pins)
	unpin()
	unpin() // idempotent
	require.True(t, released)
	regions, pins = r.Stats()
	require.Equal(t, 1, regions)
	require.Equal(t, 0, pins)
	require.ErrorIs(t, r.Deregister(g.ID, nil), ErrNotFound)
}

func TestConcurrent(t *testing.T) {
	r := NewRegistry()
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			base := uintptr(w+1) << 32
			for i := 0; i < 500; i++ {
				g, err := r.Register("host", base+uintptr(i)*128, 128)
				if err != nil {
					t.Error(err)
					return
				}
				if got, err := r.Lookup("host", base+uintptr(i)*128+5, 10); err != nil || got.ID != g.ID {
					t.Error("lookup", err)
				}
				unpin, err := r.Pin(g.ID)
				if err != nil {
					t.Error(err)
					return
				}
				done := make(chan struct{})
				if err := r.Deregister(g.ID, func() { close(done) }); err != nil {
					t.Error(err)
				}
				unpin()
				<-done
			}
		}(w)
	}
	wg.Wait()
	regions, pins := r.Stats()
	require.Zero(t, regions)
	require.Zero(t, pins)
	_, err := r.Pin(1)
	require.True(t, errors.Is(err, ErrNotFound))
}

// TestRegisterShared: foreign memory may be registered twice (two files over
// one buffer, like two ibv_reg_mr calls), never over tensorfs's own regions;
// lookups and deregistration see each region.
func TestRegisterShared(t *testing.T) {
	r := NewRegistry()
	own, err := r.Register("cuda:0", 0x10000, 0x1000)
	require.NoError(t, err)
	a, err := r.RegisterShared("cuda:0", 0x20000, 0x4000)
	require.NoError(t, err)
	b, err := r.RegisterShared("cuda:0", 0x21000, 0x1000)
	require.NoError(t, err, "overlaps a only: allowed")
	require.NotEqual(t, a.ID, b.ID)
	_, err = r.RegisterShared("cuda:0", 0x10800, 0x1000)
	require.ErrorIs(t, err, ErrOverlap, "never over tensorfs's own memory")
	_, err = r.Register("cuda:0", 0x20000, 0x10)
	require.NoError(t, err, "own regions are checked among themselves; imported memory never shares their addresses")
	got, err := r.Lookup("cuda:0", 0x23000, 0x10)
	require.NoError(t, err)
	require.Equal(t, a.ID, got.ID)
	require.NoError(t, r.Deregister(a.ID, nil))
	_, err = r.Lookup("cuda:0", 0x23000, 0x10)
	require.ErrorIs(t, err, ErrNotFound)
	got, err = r.Lookup("cuda:0", 0x21000, 0x10)
	require.NoError(t, err)
	require.Equal(t, b.ID, got.ID)
	require.NoError(t, r.Deregister(b.ID, nil))
	require.NoError(t, r.Deregister(own.ID, nil))
	n, _ := r.Stats()
	require.Equal(t, 1, n)
}

// recMapper is a Mapper that records what it mapped and unmapped, in order
// with the release callbacks (events).
type recMapper struct {
	mu     sync.Mutex
	events []string
	fail   bool
}

func (m *recMapper) Map(device string, addr uintptr, length uint64) ([]byte, func(), error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return nil, nil, errors.New("no memory for the transport")
	}
	if device != "host" {
		return nil, nil, nil
	}
	m.events = append(m.events, fmt.Sprintf("map %#x+%d", addr, length))
	return []byte(fmt.Sprintf("key-%#x", addr)), func() { m.add(fmt.Sprintf("unmap %#x", addr)) }, nil
}

func (m *recMapper) add(ev string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.events = append(m.events, ev)
}

func (m *recMapper) got() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.events)
}

// TestMapperLifetime: a region is mapped when it is registered (its rkey
// on the Region), unmapped only once it is deregistered and unpinned and
// before its release callback frees the memory; memory the mapper does
// not map has no rkey and nothing to unmap; a registration that fails
// (an overlap) unmaps what it mapped; a mapping that fails fails the
// registration and leaves nothing registered.
func TestMapperLifetime(t *testing.T) {
	r := NewRegistry()
	m := &recMapper{}
	r.SetMapper(m)
	a, err := r.Register("host", 0x1000, 0x1000)
	require.NoError(t, err)
	require.Equal(t, []byte("key-0x1000"), a.Rkey)
	require.Equal(t, []string{"map 0x1000+4096"}, m.got())

	unpin, err := r.Pin(a.ID)
	require.NoError(t, err)
	require.NoError(t, r.Deregister(a.ID, func() { m.add("free 0x1000") }))
	require.Equal(t, []string{"map 0x1000+4096"}, m.got(), "pinned: still mapped")
	unpin()
	require.Equal(t, []string{"map 0x1000+4096", "unmap 0x1000", "free 0x1000"}, m.got(), "unmapped before the memory goes")

	g, err := r.Register("cuda:0", 0x1000, 0x1000)
	require.NoError(t, err)
	require.Nil(t, g.Rkey, "device memory this mapper does not map")
	require.NoError(t, r.Deregister(g.ID, nil))

	b, err := r.Register("host", 0x8000, 0x1000)
	require.NoError(t, err)
	_, err = r.Register("host", 0x8800, 0x1000)
	require.ErrorIs(t, err, ErrOverlap)
	require.Equal(t, []string{"map 0x8000+4096", "map 0x8800+4096", "unmap 0x8800"}, m.got()[3:], "the overlapping one was mapped, then unmapped")

	m.fail = true
	before := r.Registered()
	_, err = r.Register("host", 0x20000, 0x1000)
	require.ErrorContains(t, err, "no memory for the transport")
	require.Equal(t, before, r.Registered(), "no id given")
	regions, _ := r.Stats()
	require.Equal(t, 1, regions, "only b")
	m.fail = false
	require.NoError(t, r.Deregister(b.ID, nil))
	require.Equal(t, "unmap 0x8000", m.got()[len(m.got())-1])
}
