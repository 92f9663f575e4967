package gpu

import "runtime"

// moveChunk bounds one memmove or clear of host memory. A goroutine inside
// runtime.memmove cannot be preempted, so a single copy of a GiB (seconds
// on memory the machine has not touched lately) holds up every
// stop-the-world of the process until it ends: the garbage collector, and
// with it the FUSE server and the keepalives a waiting peer times out
// without (seen as a peer giving up on a 1 GiB IPC pull).
const moveChunk = 4 << 20

// move is copy(dst, src) in moveChunk pieces, with a point between them
// where the goroutine can be stopped (a loop around memmove has none of
// its own: the call is to assembly that never checks); it returns the
// bytes copied.
func move(dst, src []byte) int {
	n := min(len(dst), len(src))
	for off := 0; off < n; off += moveChunk {
		if off > 0 {
			runtime.Gosched()
		}
		end := min(off+moveChunk, n)
		copy(dst[off:end], src[off:end])
	}
	return n
}

// zero is clear(b) in moveChunk pieces, like move.
func zero(b []byte) {
	for off := 0; off < len(b); off += moveChunk {
		if off > 0 {
			runtime.Gosched()
		}
		clear(b[off:min(off+moveChunk, len(b))])
	}
}
