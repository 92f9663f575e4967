package transfer

import (
	"math/bits"
	"sync"
)

// Chunk buffers are pooled across transfers: a copy of a few MiB allocated
// (and the runtime cleared, and the kernel faulted in) its megabytes of
// chunk buffers anew each time, a third of its time on this repository's
// 2-core VM (an 8 MiB in-place copy over TCP; bench/history.md).
//
// A buffer's class is its payload capacity, a power of two from
// minBufClass up to the largest frame, plus bufSlack bytes for the
// headers in front of it. A buffer starts bufPad bytes into its
// allocation, so that a chunk read behind its frame's headers
// (frameOverhead) starts 32-byte aligned: a memmove of 1 MiB into it and
// its CRC32C took three times as long at offset 21 as at 16 or 32 (5.6
// against 15.5 GB/s, this VM), and a copy over TCP lost a fifth.
const (
	minBufClass = 12 // 4 KiB
	maxBufClass = 23 // 8 MiB: above MaxFrame
	bufSlack    = 64
	bufPad      = 32 - frameOverhead
)

var bufPools [maxBufClass + 1]sync.Pool

// bufClass is the class whose buffers hold n bytes, or -1 past the largest.
// A buffer holds bufSlack-bufPad bytes beyond its class's power of two
// (its pad is in front): until 2026-12-06 the pad was not counted, and a
// 4099-byte tensor's put (a 4152-byte block of frames) sliced past its
// 4149-byte buffer, a panic in the sending daemon.
func bufClass(n int) int {
	c := max(bits.Len(uint(max(n-(bufSlack-bufPad), 1)-1)), minBufClass)
	if c > maxBufClass {
		return -1
	}
	return c
}

// getBuf returns a buffer of length n (its bytes left by an earlier use:
// the caller overwrites what it reads), pooled when n fits a class.
func getBuf(n int) []byte {
	c := bufClass(n)
	if c < 0 {
		return make([]byte, n)
	}
	if p, ok := bufPools[c].Get().(*[]byte); ok {
		return (*p)[:n]
	}
	return make([]byte, 1<<c+bufSlack)[bufPad : bufPad+n]
}

// putBuf gives b back to its pool for a later getBuf; a buffer no pool
// made is dropped. b must not be used after.
func putBuf(b []byte) {
	c := bufClass(cap(b))
	if c < 0 || cap(b) != 1<<c+bufSlack-bufPad {
		return
	}
	b = b[:cap(b)]
	bufPools[c].Put(&b)
}
