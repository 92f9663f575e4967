package transfer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
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
		src := &memHostSource{&memSource{l: newMemLocal(), meta: meta, data: mem}}
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

// A small put goes as one write: its request, its chunks and its done
// frame, so that the destination wakes once for all of it. (The done
// frame was a second write, a few µs later: on a loaded host the
// destination had gone back to waiting by then, and woke again.) A pipe's
// Read returns one Write's bytes, so the first Read must hold the done
// frame too; both the copy from buffers and the one from host memory.
func TestSmallPutOneWrite(t *testing.T) {
	data := make([]byte, 4096)
	rand.NewChaCha8([32]byte{6}).Read(data)
	meta := Meta{DType: "U8", Shape: "4096", NBytes: 4096, InPlace: true}
	for _, host := range []bool{false, true} {
		t.Run(fmt.Sprintf("host=%v", host), func(t *testing.T) {
			l := newMemLocal()
			var src Source = &memSource{l: l, meta: meta, data: data}
			if host {
				src = &memHostSource{&memSource{l: l, meta: meta, data: data}}
			}
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			s := &Service{}
			sd := newSender([]Source{src}, 256<<10, 1, ChecksumNone, false, &Record{}, &streamSet{dead: make(chan struct{})})
			require.True(t, sd.inline, "a small put's chunks go inline")
			defer sd.release()
			done := make(chan error, 1)
			go func() {
				_, err := s.sendSmall(wrapConn(a, "b"), request{Op: "put", Path: "/x", Tensors: []Meta{meta}}, sd)
				done <- err
			}()
			buf := make([]byte, 1<<20)
			n, err := b.Read(buf)
			require.NoError(t, err)
			got := buf[:n]
			// The last frame of the write is the done frame.
			var frames []byte
			for p := got; len(p) > 0; {
				require.GreaterOrEqual(t, len(p), frameHeaderLen)
				l := 4 + int(binary.BigEndian.Uint32(p[:4])) // the length counts the type byte
				require.GreaterOrEqual(t, len(p), l, "whole frames")
				frames = append(frames, p[4])
				p = p[l:]
			}
			require.Equal(t, []byte{frameRequest, frameData, frameDone}, frames, "request, data and done in the first write")
			require.Contains(t, string(got), string(data), "the chunk's bytes")
			c := wrapConn(b, "a")
			require.NoError(t, c.sendJSON(frameOK, reply{Copied: 1}))
			require.NoError(t, <-done)
		})
	}
}
