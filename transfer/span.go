package transfer

import (
	"fmt"
	"math"
	"sort"
	"syscall"
)

// Span is one contiguous piece of a range-list descriptor (Meta.Spans): N
// bytes at byte Src of the source tensor written in place at byte Dst of the
// destination tensor. Pos is the piece's first byte in the descriptor's own
// byte space, the spans' bytes laid end to end in order (what data frames
// and Dest.WriteAt address); it is the sum of the N before it, so it does
// not travel (decodeTable computes it). All in bytes.
//
// Why a descriptor carries a list: the lines of a KV-cache call name one
// source tensor and one destination tensor a thousand times. As a thousand
// descriptors each paid a source open, a table row, an export, a
// destination item and, over TCP, a data frame of 8 KiB (1.9 ms for 1000 x
// 8 KiB on an H200 against a 70 µs floor); as one descriptor with a span
// list they cost one of each, and a TCP stream carries them in full-sized
// chunks.
type Span struct {
	Pos, Src, Dst, N int64
}

// SpanEnd is the end of the byte space of spans laid end to end: the sum of
// their N.
func SpanEnd(spans []Span) int64 {
	if len(spans) == 0 {
		return 0
	}
	last := spans[len(spans)-1]
	return last.Pos + last.N
}

// Pieces calls fn for each contiguous piece of bytes [off, off+n) of a
// descriptor with spans, in order: n bytes at src in the source and dst in
// the destination, pos in the descriptor's byte space. It stops at fn's
// first error and returns it. A piece is never empty. Errors: EINVAL when
// the range does not lie inside the spans (a caller that checked it against
// the descriptor's NBytes never sees it), after the pieces that do.
func Pieces(spans []Span, off, n int64, fn func(pos, src, dst, n int64) error) error {
	if off < 0 || n < 0 {
		return &Error{Errno: syscall.EINVAL, Msg: fmt.Sprintf("bytes [%d, +%d) of a range list", off, n)}
	}
	end := off + n
	// The first span ending past off.
	i := sort.Search(len(spans), func(i int) bool { return spans[i].Pos+spans[i].N > off })
	for ; i < len(spans) && off < end; i++ {
		s := spans[i]
		if s.N == 0 {
			continue
		}
		in := off - s.Pos
		k := min(s.N-in, end-off)
		if err := fn(off, s.Src+in, s.Dst+in, k); err != nil {
			return err
		}
		off += k
	}
	if off < end {
		return &Error{Errno: syscall.EINVAL, Msg: fmt.Sprintf("bytes [%d, %d) past a range list of %d", off, end, SpanEnd(spans))}
	}
	return nil
}

// checkSpans checks a peer's span list of a descriptor of nbytes: every
// offset and length non-negative, no end past int64, the positions laid end
// to end from 0, and their sum nbytes. Errors: EPROTO.
func checkSpans(spans []Span, nbytes int64) error {
	var pos int64
	for i, s := range spans {
		if s.N < 0 || s.Src < 0 || s.Dst < 0 || s.Src > math.MaxInt64-s.N || s.Dst > math.MaxInt64-s.N || s.Pos != pos || pos > math.MaxInt64-s.N {
			return &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("span %d (%d bytes from %d to %d at %d)", i, s.N, s.Src, s.Dst, s.Pos)}
		}
		pos += s.N
	}
	if pos != nbytes {
		return &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("spans of %d bytes in a descriptor of %d", pos, nbytes)}
	}
	return nil
}

// Descriptors is how many descriptors m stands for, as stats counts them
// (copies.descriptors): its spans, or 1.
func (m Meta) Descriptors() int64 {
	return max(1, int64(len(m.Spans)))
}
