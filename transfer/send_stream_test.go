package transfer

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// A range list's pieces that lie back to back in the source are sent from
// one slice and summed in one pass (KV blocks scattered into a peer's cache
// from one contiguous staging tensor), and the chunk's sum is that of its
// bytes in the list's order whatever the pieces.
func TestHostChunkJoinsAdjacentPieces(t *testing.T) {
	mem := make([]byte, 64<<10)
	rand.NewChaCha8([32]byte{3}).Read(mem)
	const blk = 4096
	// Five pieces: three back to back in the source (scattered on the
	// destination's side), then a jump back, then one that follows it.
	spans := []Span{
		{Pos: 0, Src: 0, Dst: 9 * blk, N: blk},
		{Pos: blk, Src: blk, Dst: 2 * blk, N: blk},
		{Pos: 2 * blk, Src: 2 * blk, Dst: 7 * blk, N: blk},
		{Pos: 3 * blk, Src: 10 * blk, Dst: 0, N: blk},
		{Pos: 4 * blk, Src: 11 * blk, Dst: blk, N: 2 * blk},
	}
	meta := Meta{DType: "U8", Shape: "24576", NBytes: 6 * blk, InPlace: true, Spans: spans}
	var want []byte
	for _, s := range spans {
		want = append(want, mem[s.Src:s.Src+s.N]...)
	}
	for _, k := range []Checksum{ChecksumXXH3, ChecksumCRC32C, ChecksumNone} {
		src := &memHostSource{&memSource{meta: meta, data: mem}}
		sd := newSender([]Source{src}, 256<<10, 1, k, true, nil, nil)
		buf := make([]byte, frameOverhead)
		out, ok := sd.hostChunk(nil, buf, 0, 0, meta.NBytes, chunkHeader{kind: k})
		require.True(t, ok, "%s: sent from host memory", k)
		require.Equal(t, 3, len(out), "%s: the headers, then one slice for the first three pieces and one for the other two", k)
		require.Equal(t, want, bytes.Join(out[1:], nil), "%s: the bytes in the list's order", k)
		h, _, err := parseChunk(out[0][frameHeaderLen:])
		require.NoError(t, err)
		require.Equal(t, k.sum(want), h.sum, "%s: the chunk's sum", k)
	}
}
