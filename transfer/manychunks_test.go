package transfer

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// smallTensors puts n tensors of 3-8 KiB under root on l (KV blocks:
// chunks an inline sender packs into blocks) and returns their bytes.
func smallTensors(l *memLocal, root string, n int, seed uint64) map[string][]byte {
	r := rand.New(rand.NewPCG(seed, 9))
	want := map[string][]byte{}
	for i := range n {
		rel := fmt.Sprintf("l%d/b%04d", i%4, i)
		data := pattern(seed+uint64(i), 3<<10+r.IntN(5<<10))
		l.put(root+"/"+rel, data)
		want[rel] = data
	}
	return want
}

// TestManySmallChunks: a copy of many small chunks with their CRC32C (the
// sender's inline blocks, the receiver's chunks checked on the stream's
// goroutine, gathered into batches for a destination that takes them),
// with large chunks among them (read into buffers straight from the socket
// and checked by the stream's checker): every byte lands, pushed and
// pulled, over one stream and two, into destinations written in place,
// chunk by chunk and in batches; the ends hold nothing after.
func TestManySmallChunks(t *testing.T) {
	for _, tc := range []struct {
		name           string
		inPlace, batch bool
		chunk          int // Config.ChunkSize: 0, one stream; 64 KiB, two
	}{
		{"in-place", true, false, 0},
		{"in-place,2-streams", true, false, 64 << 10},
		{"write-at,2-streams", false, false, 64 << 10},
		{"batches", false, true, 0},
		{"batches,2-streams", false, true, 64 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, func(c *Config) { c.ChunkSize = tc.chunk })
			for _, l := range []*memLocal{p.a, p.b} {
				l.inPlace, l.batch = tc.inPlace, tc.batch
			}
			want := smallTensors(p.a, "/kv", 400, 3) // about 2.2 MiB: several blocks
			// And large chunks among them.
			want["big"] = pattern(33, 3<<20+5)
			p.a.put("/kv/big", want["big"])
			ctx := context.Background()
			n, err := push(ctx, p.client, p.a, "/kv", "b", "/kv")
			require.NoError(t, err)
			require.Equal(t, len(want), n)
			n, err = pull(ctx, p.client, p.a, "b", "/kv", "/back")
			require.NoError(t, err)
			require.Equal(t, len(want), n)
			for rel, data := range want {
				for _, got := range []struct {
					l    *memLocal
					path string
				}{{p.b, "/kv/" + rel}, {p.a, "/back/" + rel}} {
					b, _, ok := got.l.get(got.path)
					require.True(t, ok, got.path)
					require.True(t, bytes.Equal(data, b), got.path)
				}
			}
			if tc.batch {
				for _, l := range []*memLocal{p.a, p.b} {
					l.mu.Lock()
					batches := l.batches
					l.mu.Unlock()
					require.Positive(t, batches)
					require.Less(t, batches, int64(2*len(want)/10), "chunks gathered into batches")
				}
			}
			if tc.inPlace {
				require.Positive(t, p.b.inPlaceChunks(), "the chunks went into place")
			}
			requireClean(t, p.a)
			requireClean(t, p.b)
		})
	}
}

// TestCorruptChunkAmongMany: one corrupted chunk among many, small ones
// or large ones (read straight from the socket into their buffers), is an
// EIO, the destination is aborted and nothing is committed, whether it is
// the first chunk, one in the middle or the last, whatever the
// destination takes, and with either sum.
func TestCorruptChunkAmongMany(t *testing.T) {
	for _, tc := range []struct{ n, size int }{{300, 4 << 10}, {12, 256 << 10}} {
		for _, bad := range []int{0, tc.n / 2, tc.n - 1} {
			for _, inPlace := range []bool{false, true} {
				for _, k := range []Checksum{ChecksumXXH3, ChecksumCRC32C} {
					corruptChunkAmongMany(t, tc.n, tc.size, bad, inPlace, k)
				}
			}
		}
	}
}

// corruptChunkAmongMany is TestCorruptChunkAmongMany's put of n chunks of
// size bytes with sums of kind k, chunk bad corrupted, into a destination
// written in place or through WriteAt.
func corruptChunkAmongMany(t *testing.T, n, size, bad int, inPlace bool, k Checksum) {
	data := pattern(5, n*size)
	t.Run(fmt.Sprintf("size=%d,chunk=%d,inPlace=%v,%v", size, bad, inPlace, k), func(t *testing.T) {
		b := newMemLocal()
		b.inPlace = inPlace
		b.put("/x", bytes.Repeat([]byte{7}, n*size))
		srv := startServer(t, "b", b, testSecret, nil)
		before := b.snapshot()
		c := authed(t, srv)
		putRequest(t, c, "/x", Meta{DType: "U8", Shape: fmt.Sprint(n * size), NBytes: int64(n * size)})
		for i := range n {
			p := data[i*size : (i+1)*size]
			h := chunkHeader{offset: int64(i * size), sum: k.sum(p), kind: k}
			if i == bad {
				h.sum ^= 1
			}
			if err := c.send(frameData, sumFrame(h, p)); err != nil {
				break // the server may hang up once it has failed the put
			}
		}
		c.sendJSON(frameDone, doneMsg{Chunks: int64(n)})
		we := requirePutRefused(t, c, b, before, "EIO")
		require.Contains(t, we.Message, fmt.Sprintf("checksum mismatch (%v) in \"/x\" at %d", k, bad*size))
	})
}

// TestLargeChunkStalled: a large chunk with its CRC32C (read straight from
// the socket, readFull) whose sender stops half-way: when the rest comes,
// the chunk completes and checks; when it never comes, the put fails with
// ETIMEDOUT within the receiver's timeout and nothing is committed.
func TestLargeChunkStalled(t *testing.T) {
	// The rest comes a tenth of the timeout late: well inside it, however
	// loaded the machine, and past any spin (the read waits).
	const timeout = time.Second
	data := pattern(34, 256<<10+1) // past inlineMax: a buffered chunk
	for _, rest := range []bool{true, false} {
		t.Run(fmt.Sprintf("rest=%v", rest), func(t *testing.T) {
			b := newMemLocal()
			b.inPlace = true
			b.put("/x", make([]byte, len(data)))
			srv := startServer(t, "b", b, testSecret, func(c *Config) { c.Timeout = timeout })
			before := b.snapshot()
			c := authed(t, srv)
			putRequest(t, c, "/x", Meta{DType: "U8", Shape: fmt.Sprint(len(data)), NBytes: int64(len(data))})
			more := sendHalfChunk(t, c, data)
			if rest {
				time.Sleep(timeout / 10)
				finishHalfChunk(t, c, more, b, data)
				return
			}
			start := time.Now()
			requirePutRefused(t, c, b, before, "ETIMEDOUT")
			require.Less(t, time.Since(start), 4*timeout)
		})
	}
}
