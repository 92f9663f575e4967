package transfer

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestBufPool: a buffer holds what was asked, comes back from the pool for
// the same class, and puts a chunk read behind its frame's headers at a
// 32-byte aligned address; what no pool made is dropped.
func TestBufPool(t *testing.T) {
	// Each class's last size and the next one's first: 4096+bufSlack-bufPad
	// is the most a 4 KiB class's buffer holds behind its pad.
	for _, n := range []int{1, 4096, 4096 + frameOverhead, 4096 + bufSlack - bufPad, 4096 + bufSlack - bufPad + 1, 4096 + bufSlack, 1 << 20, 1<<20 + frameOverhead, 4<<20 + frameOverhead, 1<<maxBufClass + bufSlack - bufPad} {
		b := getBuf(n)
		require.Len(t, b, n)
		c := bufClass(n)
		require.GreaterOrEqual(t, c, minBufClass)
		require.Equal(t, 1<<c+bufSlack-bufPad, cap(b), "n=%d", n)
		require.Zero(t, uintptr(unsafe.Pointer(&b[:cap(b)][frameOverhead]))%32, "n=%d: chunk bytes aligned", n)
		putBuf(b)
		again := getBuf(n)
		require.Equal(t, cap(b), cap(again))
		putBuf(again)
	}
	require.Equal(t, -1, bufClass(16<<20))
	require.Len(t, getBuf(16<<20), 16<<20, "past the largest class: allocated, not pooled")
	putBuf(make([]byte, 4096)) // not the pool's: dropped, no panic
	putBuf(nil)
}
