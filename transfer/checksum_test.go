package transfer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestChecksumNegotiation: the checksum a copy's chunks carry, for every
// pair of settings of the two nodes (checksumWith): XXH3 when both take
// it and neither insists on CRC32C, none only when both say none, else
// CRC32C; the same both ways, as the stats of each side's transfers and
// the client's peer report say. A source in host memory is sent straight
// from it (no ReadAt: not one byte copied into a send buffer), on every
// way a sender sends: an eager small put (inline frames), a large put and
// a large pull over several streams (reader goroutines); with a sum, as
// both nodes take copies summed where their bytes lie (request.Recheck;
// TestRecheck* have the buffers that follow a mismatch).
func TestChecksumNegotiation(t *testing.T) {
	small, large := pattern(21, 4096+3), pattern(22, 3<<20+5)
	kinds := []Checksum{ChecksumXXH3, ChecksumCRC32C, ChecksumNone}
	for _, client := range kinds {
		for _, server := range kinds {
			want := ChecksumCRC32C
			switch {
			case client == ChecksumNone && server == ChecksumNone:
				want = ChecksumNone
			case client != ChecksumCRC32C && server != ChecksumCRC32C:
				want = ChecksumXXH3
			}
			t.Run(fmt.Sprintf("client=%v,server=%v", client, server), func(t *testing.T) {
				p := &pair{a: newMemLocal(), b: newMemLocal()}
				p.a.hostMem, p.b.hostMem = true, true
				p.srv = startServer(t, "b", p.b, testSecret, func(c *Config) { c.Checksum = server; c.ChunkSize = 256 << 10 })
				p.client = newClient(t, "a", p.a, testSecret, map[string]string{"b": addrOf(p.srv)}, func(c *Config) { c.Checksum = client; c.ChunkSize = 256 << 10 })
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
				require.Zero(t, p.a.reads.Load(), "the pushes' sources were read into buffers")
				require.Zero(t, p.b.reads.Load(), "the pull's source was read into buffers")
				require.Greater(t, p.client.Stats().Copies.TCP, int64(0))
				require.Equal(t, want.String(), p.client.Stats().Peers["b"].Checksum, "stats say the check of copies with b")
				for _, s := range []*Service{p.client, p.srv} {
					recent := s.Stats().Transfers.Recent
					require.Len(t, recent, 3)
					for _, r := range recent {
						require.Equal(t, want.String(), r.Checksum, "%+v", r)
					}
				}
				requireClean(t, p.a)
				requireClean(t, p.b)
			})
		}
	}
}

// TestChecksumOlderPeer: a node of a release before XXH3 says nothing of it
// in its handshake, and gets CRC32C from a node that runs the default: a
// raw client of that hello pulls a tensor, and every chunk comes with its
// CRC32C.
func TestChecksumOlderPeer(t *testing.T) {
	b := newMemLocal()
	data := pattern(23, 3<<20+7)
	b.put("/x", data)
	srv := startServer(t, "b", b, testSecret, func(c *Config) { c.ChunkSize = 256 << 10 })
	c := authed(t, srv) // its hello has no xxh3
	c.max = MaxFrame    // data frames
	// In place: the data follows the reply, with no go-ahead to give.
	require.NoError(t, c.sendJSON(frameRequest, request{Op: "get", Path: "/x", InPlace: true}))
	var r reply
	require.NoError(t, c.recvJSON(frameOK, &r))
	require.False(t, r.WaitGo)
	got := make([]byte, len(data))
	chunks := 0
	for {
		typ, p, err := c.recv()
		require.NoError(t, err)
		if typ == frameDone {
			break
		}
		require.Equal(t, frameData, typ)
		h, body, err := parseChunk(p)
		require.NoError(t, err)
		require.Equal(t, ChecksumCRC32C, h.kind, "chunk at %d", h.offset)
		require.Equal(t, crcOf(body), h.sum, "chunk at %d", h.offset)
		copy(got[h.offset:], body)
		chunks++
	}
	require.Equal(t, data, got)
	require.Greater(t, chunks, 1)
	recent := srv.Stats().Transfers.Recent
	require.Equal(t, "crc32c", recent[len(recent)-1].Checksum)
}

// TestChunkSums: what a receiver makes of each kind of chunk, whatever it
// runs: a chunk without a sum is refused (EPROTO, nothing committed)
// unless the receiver runs none, which takes it whatever its sum field
// holds; one with its XXH3 or CRC32C is taken by every receiver (each
// checks both), and one whose sum is wrong fails (EIO, nothing
// committed); a header with both sum flags is no frame (EPROTO).
func TestChunkSums(t *testing.T) {
	data := []byte("newbytes")
	for _, recv := range []Checksum{ChecksumXXH3, ChecksumCRC32C, ChecksumNone} {
		for _, tc := range []struct {
			name  string
			h     chunkHeader
			errno string
			msg   string
		}{
			{"none", chunkHeader{sum: 0xdeadbeef, kind: ChecksumNone}, "EPROTO", "without its checksum"},
			{"xxh3", chunkHeader{sum: ChecksumXXH3.sum(data), kind: ChecksumXXH3}, "", ""},
			{"crc32c", chunkHeader{sum: crcOf(data), kind: ChecksumCRC32C}, "", ""},
			{"bad-xxh3", chunkHeader{sum: ChecksumXXH3.sum(data) ^ 1, kind: ChecksumXXH3}, "EIO", `checksum mismatch (xxh3) in "/x" at 0`},
			{"bad-crc32c", chunkHeader{sum: crcOf(data) ^ 1, kind: ChecksumCRC32C}, "EIO", `checksum mismatch (crc32c) in "/x" at 0`},
			{"both-flags", chunkHeader{index: xxh3Flag, kind: ChecksumNone}, "EPROTO", "both sum flags"},
		} {
			t.Run(fmt.Sprintf("%v/%s", recv, tc.name), func(t *testing.T) {
				if recv == ChecksumNone && tc.name == "none" {
					tc.errno = ""
				}
				b := newMemLocal()
				b.put("/x", []byte("old contents"))
				srv := startServer(t, "b", b, testSecret, func(c *Config) { c.Checksum = recv })
				before := b.snapshot()
				c := authed(t, srv)
				putRequest(t, c, "/x", Meta{DType: "U8", Shape: "8", NBytes: 8})
				require.NoError(t, c.send(frameData, sumFrame(tc.h, data)))
				require.NoError(t, c.sendJSON(frameDone, doneMsg{Chunks: 1}))
				if tc.errno != "" {
					we := requirePutRefused(t, c, b, before, tc.errno)
					require.Contains(t, we.Message, tc.msg)
					return
				}
				require.NoError(t, c.recvJSON(frameOK, nil))
				got, _, _ := b.get("/x")
				require.Equal(t, data, got)
				requireClean(t, b)
				recent := srv.Stats().Transfers.Recent
				require.Equal(t, tc.h.kind.String(), recent[len(recent)-1].Checksum)
			})
		}
	}
	// The flags are the index's top two bits: parsed apart from the
	// index; both at once is no header.
	for _, k := range []Checksum{ChecksumXXH3, ChecksumCRC32C, ChecksumNone} {
		var hdr [dataHeaderLen]byte
		want := chunkHeader{index: 1<<30 - 1, offset: 9, sum: 0xfeedf00d, kind: k}
		putChunkHeader(hdr[:], want)
		h, _, err := parseChunk(hdr[:])
		require.NoError(t, err)
		require.Equal(t, want, h)
	}
	var hdr [dataHeaderLen]byte
	putChunkHeader(hdr[:], chunkHeader{index: 7 | xxh3Flag, kind: ChecksumNone})
	_, _, err := parseChunk(hdr[:])
	require.ErrorIs(t, err, ErrFrame)
}

// TestChecksumRecordNeedsAChunk: a TCP transfer's record names a checksum
// only once a chunk has gone: a push of an empty tensor (no chunk) has
// none on either side, a push of bytes has the same on both.
func TestChecksumRecordNeedsAChunk(t *testing.T) {
	p := newPair(t, nil)
	p.a.put("/empty", nil)
	p.a.put("/x", []byte("12345678"))
	ctx := context.Background()
	_, err := push(ctx, p.client, p.a, "/empty", "b", "/empty")
	require.NoError(t, err)
	_, err = push(ctx, p.client, p.a, "/x", "b", "/x")
	require.NoError(t, err)
	for _, s := range []*Service{p.client, p.srv} {
		recent := s.Stats().Transfers.Recent
		require.Len(t, recent, 2)
		require.Empty(t, recent[0].Checksum, "%s: %+v", s.cfg.Name, recent[0])
		require.Equal(t, "xxh3", recent[1].Checksum, "%s: %+v", s.cfg.Name, recent[1])
	}
}

// TestChecksumConfigRefused: New refuses a Checksum that is none of the
// three (a library caller's mistake; the daemon parses --checksum).
func TestChecksumConfigRefused(t *testing.T) {
	_, err := New(Config{Name: "a", Checksum: ChecksumNone + 1}, newMemLocal())
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorContains(t, err, "Checksum(3)")
}

// TestSummerMatchesSum: a sum taken piece by piece (summer and sumPieces: a range
// list's spans, a socket's reads) is the sum of the pieces back to back,
// however they are cut, for both kinds; none sums to 0.
func TestSummerMatchesSum(t *testing.T) {
	data := pattern(45, 300<<10+77)
	for _, k := range []Checksum{ChecksumXXH3, ChecksumCRC32C, ChecksumNone} {
		for _, cut := range []int{1, 63, 1024, 8 << 10, 100 << 10, len(data)} {
			var s summer
			s.reset(k)
			var pieces [][]byte
			for p := data; len(p) > 0; {
				n := min(cut, len(p))
				s.write(p[:n])
				pieces = append(pieces, p[:n])
				p = p[n:]
			}
			require.Equal(t, k.sum(data), s.sum(), "%v in pieces of %d", k, cut)
			require.Equal(t, k.sum(data), k.sumPieces(pieces), "sumPieces: %v in pieces of %d", k, cut)
		}
		var s summer
		s.reset(k)
		require.Equal(t, k.sum(nil), s.sum(), "%v of nothing", k)
	}
}

// The summer's XXH3 over pieces of every size, split at random and around
// the hasher's block (1 KiB) and buffer (1 KiB and a 64-byte stripe), is
// the one-pass sum: third_party/xxh3's Hasher accumulates blocks straight
// from the pieces, and a slip in where it bridges a buffered block and a
// piece's bytes would change the sum.
func TestSummerPiecesAnySplit(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	data := make([]byte, 300<<10)
	rand.NewChaCha8([32]byte{9}).Read(data)
	for i := range 20000 {
		n := r.IntN(len(data))
		if i < 5000 {
			n = r.IntN(5000)
		}
		var sm summer
		sm.reset(ChecksumXXH3)
		for rest := data[:n]; len(rest) > 0; {
			k := r.IntN(len(rest) + 1)
			switch r.IntN(4) {
			case 0:
				k = r.IntN(70)
			case 1:
				k = 1024 + r.IntN(130) - 65
			}
			k = min(k, len(rest))
			sm.write(rest[:k])
			rest = rest[k:]
		}
		require.Equal(t, ChecksumXXH3.sum(data[:n]), sm.sum(), "%d bytes", n)
	}
}

// BenchmarkSummerPieces: a 256 KiB chunk's XXH3 in one pass, and through
// the summer as a range list's 8 KiB pieces or a socket's 1500-byte reads
// give it (third_party/xxh3/PATCHES.md).
func BenchmarkSummerPieces(b *testing.B) {
	data := make([]byte, 256<<10)
	rand.NewChaCha8([32]byte{1}).Read(data)
	b.Run("one-pass", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			ChecksumXXH3.sum(data)
		}
	})
	for _, piece := range []int{8192, 1500} {
		b.Run(fmt.Sprintf("pieces-%d", piece), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			var sm summer
			for b.Loop() {
				sm.reset(ChecksumXXH3)
				for o := 0; o < len(data); o += piece {
					sm.write(data[o:min(o+piece, len(data))])
				}
				sm.sum()
			}
		})
	}
}
