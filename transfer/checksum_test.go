package transfer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestNoChecksum: a copy goes without CRC32C only when both nodes run with
// NoChecksum, and then a source in host memory is sent straight from it
// (no ReadAt: not one byte copied into a send buffer), on every way a
// sender sends: an eager small put (inline frames), a large put and a
// large pull over several streams (reader goroutines). With either side
// checking, the chunks carry their CRC32C and the bytes are read through
// ReadAt, as before.
func TestNoChecksum(t *testing.T) {
	small, large := pattern(21, 4096+3), pattern(22, 3<<20+5)
	for _, tc := range []struct{ client, server, zeroCopy bool }{
		{true, true, true},
		{true, false, false},
		{false, true, false},
		{false, false, false},
	} {
		t.Run(fmt.Sprintf("client=%v,server=%v", tc.client, tc.server), func(t *testing.T) {
			p := &pair{a: newMemLocal(), b: newMemLocal()}
			p.a.hostMem, p.b.hostMem = true, true
			p.srv = startServer(t, "b", p.b, testSecret, func(c *Config) { c.NoChecksum = tc.server; c.ChunkSize = 256 << 10 })
			p.client = newClient(t, "a", p.a, testSecret, map[string]string{"b": addrOf(p.srv)}, func(c *Config) { c.NoChecksum = tc.client; c.ChunkSize = 256 << 10 })
			p.a.put("/small", small)
			p.a.put("/large", large)
			ctx := context.Background()
			for _, name := range []string{"/small", "/large"} {
				_, err := push(ctx, p.client, p.a, name, "b", name)
				require.NoError(t, err, name)
				requireSameTensor(t, p.a, name, p.b, name)
			}
			_, err := pull(ctx, p.client, p.a, "b", "/large", "/back")
			require.NoError(t, err)
			requireSameTensor(t, p.a, "/large", p.a, "/back")
			if tc.zeroCopy {
				require.Zero(t, p.a.reads.Load(), "the pushes' sources were read into buffers")
				require.Zero(t, p.b.reads.Load(), "the pull's source was read into buffers")
			} else {
				require.Equal(t, int64(len(small)+len(large)), p.a.reads.Load())
				require.Equal(t, int64(len(large)), p.b.reads.Load())
			}
			require.Greater(t, p.client.Stats().Copies.TCP, int64(0))
			require.Equal(t, tc.zeroCopy, p.client.Stats().Peers["b"].NoChecksum, "stats say whether copies with b go without")
			requireClean(t, p.a)
			requireClean(t, p.b)
		})
	}
}

// TestChunkWithoutChecksum: a receiver that checks refuses a chunk that
// comes without its CRC32C (EPROTO, nothing committed); one that runs
// with NoChecksum takes it, whatever its CRC field holds.
func TestChunkWithoutChecksum(t *testing.T) {
	data := []byte("newbytes")
	for _, noCRC := range []bool{false, true} {
		b := newMemLocal()
		b.put("/x", []byte("old contents"))
		srv := startServer(t, "b", b, testSecret, func(c *Config) { c.NoChecksum = noCRC })
		before := b.snapshot()
		c := authed(t, srv)
		putRequest(t, c, "/x", Meta{DType: "U8", Shape: "8", NBytes: 8})
		frame := make([]byte, dataHeaderLen+len(data))
		putChunkHeader(frame, chunkHeader{index: 0, offset: 0, crc: 0xdeadbeef, noCRC: true})
		copy(frame[dataHeaderLen:], data)
		require.NoError(t, c.send(frameData, frame))
		require.NoError(t, c.sendJSON(frameDone, doneMsg{Chunks: 1}))
		if !noCRC {
			we := expectError(t, c)
			require.Equal(t, "EPROTO", we.Errno)
			require.Contains(t, we.Message, "without its CRC32C")
			expectClosed(t, c, 2*time.Second)
			require.Equal(t, before, b.snapshot())
			requireClean(t, b)
			require.Zero(t, b.counts().Commits)
			continue
		}
		require.NoError(t, c.recvJSON(frameOK, nil))
		got, _, _ := b.get("/x")
		require.Equal(t, data, got)
		requireClean(t, b)
	}
	// The flag is the index's top bit: parsed apart from the index.
	var hdr [dataHeaderLen]byte
	putChunkHeader(hdr[:], chunkHeader{index: 7, offset: 9, noCRC: true})
	h, _, err := parseChunk(hdr[:])
	require.NoError(t, err)
	require.Equal(t, chunkHeader{index: 7, offset: 9, noCRC: true}, h)
}
