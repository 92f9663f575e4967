package tensor

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPinRange: a pinned tensor's truncate and growing writes wait for the
// unpin; writes within the size, reads and WriteRange (even while frozen)
// go on; the MR pin shows in stats; ranges outside the size are refused.
func TestPinRange(t *testing.T) {
	s := newStore(t, 64<<20)
	tt, err := s.New(Template{})
	require.NoError(t, err)
	require.NoError(t, tt.Truncate(4096))
	before := tt.Info()
	_, err = tt.PinRange(4000, 97)
	require.ErrorIs(t, err, ErrInvalid)
	unpin, err := tt.PinRange(0, 4096)
	require.NoError(t, err)
	require.Equal(t, 1, s.Stats().Pins)
	thaw := tt.Freeze()
	require.NoError(t, tt.WriteRange([]byte("abc"), 10), "an in-place write does not wait for a reader")
	require.ErrorIs(t, tt.WriteRange([]byte("abc"), 4094), ErrInvalid)
	thaw()
	_, err = tt.WriteAt([]byte("x"), 0)
	require.NoError(t, err, "a write within the size goes on")
	done := make(chan error, 1)
	go func() { done <- tt.Truncate(8192) }()
	select {
	case <-done:
		t.Fatal("the truncate did not wait for the pin")
	case <-time.After(50 * time.Millisecond):
	}
	unpin()
	unpin() // idempotent
	require.NoError(t, <-done)
	require.Zero(t, s.Stats().Pins)
	after := tt.Info()
	require.NotEqual(t, before.MRID, after.MRID, "the truncate reallocated, after the pin")
	p := make([]byte, 3)
	tt.ReadAt(p, 10)
	require.Equal(t, "abc", string(p))
}

// TestCopyExtents: extents between and within tensors in one batch; one
// outside its tensor copies nothing.
func TestCopyExtents(t *testing.T) {
	s := newStore(t, 64<<20)
	a, err := s.New(Template{})
	require.NoError(t, err)
	b, err := s.New(Template{})
	require.NoError(t, err)
	src := bytes.Repeat([]byte("0123456789"), 100)
	_, err = a.WriteAt(src, 0)
	require.NoError(t, err)
	require.NoError(t, b.Truncate(2000))
	require.NoError(t, CopyExtents([]Extent{
		{Dst: b, DstOff: 1000, Src: a, SrcOff: 0, N: 10},
		{Dst: b, DstOff: 0, Src: a, SrcOff: 5, N: 5},
		{Dst: a, DstOff: 990, Src: a, SrcOff: 0, N: 10}, // within one tensor
	}))
	got := make([]byte, 2000)
	b.ReadAt(got, 0)
	require.Equal(t, "56789", string(got[:5]))
	require.Equal(t, "0123456789", string(got[1000:1010]))
	before := bytes.Clone(got)
	require.ErrorIs(t, CopyExtents([]Extent{
		{Dst: b, DstOff: 0, Src: a, SrcOff: 0, N: 10},
		{Dst: b, DstOff: 1995, Src: a, SrcOff: 0, N: 10},
	}), ErrInvalid)
	b.ReadAt(got, 0)
	require.Equal(t, before, got, "nothing copied")
}
