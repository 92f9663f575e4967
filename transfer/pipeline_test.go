package transfer

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// morePs raises GOMAXPROCS to 2 * pipelineCPUs for the test (Go runs that
// many Ps on fewer CPUs), so that small chunks take the pipelined way, with
// two checkers a stream (checkersFor), on this 2-CPU machine too.
func morePs(t *testing.T) {
	prev := runtime.GOMAXPROCS(max(2*pipelineCPUs, runtime.GOMAXPROCS(0)))
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	require.True(t, pipelined())
	require.Equal(t, 2, checkersFor())
}

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

// TestPipelinedSmallChunks: on pipelineCPUs or more, a copy of many small
// chunks with their CRC32C is made in blocks by reader goroutines on the
// sender (blockReaders) and checked and written a batch at a time by each
// stream's checker on the receiver (gather); every byte lands, pushed and
// pulled, over one stream and two, into destinations written in place,
// chunk by chunk and in batches; the ends hold nothing after.
func TestPipelinedSmallChunks(t *testing.T) {
	morePs(t)
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
			// And large chunks among them, which two checkers a stream
			// check and write (checkersFor).
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

// TestPipelinedCorruptChunk: one corrupted chunk among many that a
// stream's two checkers check, small ones a batch at a time, is an EIO, the
// destination is aborted and nothing is committed, whether it is in the
// first batch or chunk, one in the middle or the last (flushed at the
// stream's end), and whatever the destination takes.
func TestPipelinedCorruptChunk(t *testing.T) {
	morePs(t)
	for _, tc := range []struct{ n, size int }{{300, 4 << 10}, {12, 256 << 10}} {
		for _, bad := range []int{0, tc.n / 2, tc.n - 1} {
			for _, inPlace := range []bool{false, true} {
				pipelinedCorruptChunk(t, tc.n, tc.size, bad, inPlace)
			}
		}
	}
}

// pipelinedCorruptChunk is TestPipelinedCorruptChunk's put of n chunks of
// size bytes, chunk bad corrupted, into a destination written in place or
// through WriteAt.
func pipelinedCorruptChunk(t *testing.T, n, size, bad int, inPlace bool) {
	data := pattern(5, n*size)
	t.Run(fmt.Sprintf("size=%d,chunk=%d,inPlace=%v", size, bad, inPlace), func(t *testing.T) {
		b := newMemLocal()
		b.inPlace = inPlace
		b.put("/x", bytes.Repeat([]byte{7}, n*size))
		srv := startServer(t, "b", b, testSecret, nil)
		before := b.snapshot()
		c := authed(t, srv)
		putRequest(t, c, "/x", Meta{DType: "U8", Shape: fmt.Sprint(n * size), NBytes: int64(n * size)})
		for i := range n {
			p := data[i*size : (i+1)*size]
			crc := crcOf(p)
			if i == bad {
				crc ^= 1
			}
			if err := c.send(frameData, dataFrame(0, int64(i*size), p, crc)); err != nil {
				break // the server may hang up once it has failed the put
			}
		}
		c.sendJSON(frameDone, doneMsg{Chunks: int64(n)})
		we := expectError(t, c)
		require.Equal(t, "EIO", we.Errno)
		require.Contains(t, we.Message, fmt.Sprintf("CRC32C mismatch in \"\" at %d", bad*size))
		expectClosed(t, c, 2*time.Second)
		require.Equal(t, before, b.snapshot())
		requireClean(t, b)
		require.Zero(t, b.counts().Commits)
		require.Equal(t, 1, b.counts().Aborts)
	})
}

// TestBlockReaders: a sender makes its inline blocks on reader goroutines
// only where that pays: on pipelineCPUs or more, for more than one block,
// when making a block is a pass over its bytes (a CRC32C, or a source not
// in host memory); a source sent from its mapping without a CRC is not.
func TestBlockReaders(t *testing.T) {
	open := func(hostMem bool, name string, size int) Source {
		l := newMemLocal()
		l.hostMem = hostMem
		l.put(name, pattern(1, size))
		srcs, _, err := l.Get(name, Range{})
		require.NoError(t, err)
		t.Cleanup(func() { srcs[0].Close() })
		return srcs[0]
	}
	big, small, bigNoHost := open(true, "/big", 4<<20), open(true, "/small", inlineBlock), open(false, "/big", 4<<20)
	decide := func(src Source, chunk int64, crc bool) bool {
		sd := newSender([]Source{src}, chunk, 2, crc, &Record{}, &streamSet{dead: make(chan struct{})})
		defer sd.release()
		return sd.blockReaders
	}
	t.Run("2-Ps", func(t *testing.T) {
		prev := runtime.GOMAXPROCS(2)
		t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
		require.False(t, decide(big, 8<<10, true), "on 2 Ps")
	})
	t.Run("4-Ps", func(t *testing.T) {
		morePs(t)
		require.True(t, decide(big, 8<<10, true), "CRC32C of 4 MiB")
		require.True(t, decide(bigNoHost, 8<<10, false), "4 MiB read through ReadAt")
		require.False(t, decide(big, 8<<10, false), "4 MiB sent from its mapping")
		require.False(t, decide(small, 8<<10, true), "one block")
		require.False(t, decide(big, 1<<20, true), "1 MiB chunks are not inline")
	})
}
