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

// TestCopySpans: the ranges of several lists, from a buffer into tensors,
// as one batch; a range outside its tensor, or outside the buffer, copies
// nothing of any list.
func TestCopySpans(t *testing.T) {
	s := newStore(t, 64<<20)
	src, err := s.DefaultDevice().Alloc(1000, 0)
	require.NoError(t, err)
	defer src.Free()
	_, err = src.WriteAt(bytes.Repeat([]byte("0123456789"), 100), 0)
	require.NoError(t, err)
	a, err := s.New(Template{})
	require.NoError(t, err)
	b, err := s.New(Template{})
	require.NoError(t, err)
	require.NoError(t, a.Truncate(100))
	require.NoError(t, b.Truncate(100))
	ranges := [][3]int64{{0, 50, 5}, {7, 0, 3}, {3, 97, 3}} // srcOff, dstOff, n
	at := func(k int) (int64, int64, int64) { return ranges[k][0], ranges[k][1], ranges[k][2] }
	require.NoError(t, CopySpans([]SpanList{{Dst: a, Src: src, N: 3, At: at}, {Dst: b, Src: src, N: 1, At: func(int) (int64, int64, int64) { return 10, 10, 10 }}}))
	got := make([]byte, 100)
	a.ReadAt(got, 0)
	require.Equal(t, "789", string(got[:3]))
	require.Equal(t, "01234", string(got[50:55]))
	require.Equal(t, "345", string(got[97:]))
	b.ReadAt(got, 10)
	require.Equal(t, "0123456789", string(got[:10]))

	beforeA, beforeB := make([]byte, 100), make([]byte, 100)
	a.ReadAt(beforeA, 0)
	b.ReadAt(beforeB, 0)
	zero := func(int) (int64, int64, int64) { return 0, 0, 10 }
	for _, bad := range []SpanList{
		{Dst: b, Src: src, N: 1, At: func(int) (int64, int64, int64) { return 0, 95, 10 }},  // past the tensor
		{Dst: b, Src: src, N: 1, At: func(int) (int64, int64, int64) { return 995, 0, 10 }}, // past the buffer
		{Dst: b, Src: src, N: 1, At: func(int) (int64, int64, int64) { return 0, -1, 10 }},
	} {
		require.ErrorIs(t, CopySpans([]SpanList{{Dst: a, Src: src, N: 1, At: zero}, bad}), ErrInvalid)
		a.ReadAt(got, 0)
		require.Equal(t, beforeA, got, "nothing copied into the first list's tensor")
		b.ReadAt(got, 0)
		require.Equal(t, beforeB, got)
	}
}
