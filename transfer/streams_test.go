package transfer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// streamsCfg: 4 streams of 64 KiB chunks, so that a 1 MiB tensor takes all
// four (streamsFor: at least streamChunks chunks per stream).
func streamsCfg(c *Config) {
	c.Streams = 4
	c.ChunkSize = 64 << 10
}

// lastRecord is the newest transfer record of s.
func lastRecord(t testing.TB, s *Service) RecordReport {
	t.Helper()
	r := s.Stats().Transfers.Recent
	require.NotEmpty(t, r)
	return r[len(r)-1]
}

// Push and pull of a file and of a tree over 4 streams: every byte arrives,
// both sides record 4 streams, the extra connections go back to the pool,
// and nothing leaks; with destinations that take chunks in place (host
// tensors: chunks without a CRC32C go straight there, ones with a CRC are
// buffered and checked first) and with ones that take WriteAt only (GPU
// tensors); and all of it again with spinning reads (Config.Spin) on both
// sides.
func TestParallelStreamsPushPull(t *testing.T) {
	for _, spin := range []time.Duration{0, 2 * time.Millisecond} {
		t.Run(fmt.Sprintf("spin=%v", spin), func(t *testing.T) { parallelStreamsPushPull(t, spin) })
	}
}

func parallelStreamsPushPull(t *testing.T, spin time.Duration) {
	for _, v := range []struct {
		name           string
		inPlace, noCRC bool
	}{{"in-place", true, true}, {"in-place-crc", true, false}, {"write-at", false, false}} {
		t.Run(v.name, func(t *testing.T) {
			p := newPair(t, func(c *Config) {
				streamsCfg(c)
				c.Spin = spin
				if v.noCRC {
					c.Checksum = ChecksumNone
				}
			})
			p.a.inPlace, p.b.inPlace = v.inPlace, v.inPlace
			ctx := context.Background()
			file := pattern(7, 1<<20+17) // 17 chunks, the last short
			p.a.put("/w/f", file)
			p.a.put("/w/t/a", pattern(8, 800<<10))
			p.a.put("/w/t/b/c", pattern(9, 300<<10+5))
			p.a.put("/w/t/z", nil)
			p.a.put("/w/t/d", []byte("tiny!"))
			p.a.mkdir("/back")

			n, err := push(ctx, p.client, p.a, "/w/f", "b", "/f")
			require.NoError(t, err)
			require.Equal(t, 1, n)
			requireSameTensor(t, p.a, "/w/f", p.b, "/f")
			require.EqualValues(t, 4, lastRecord(t, p.client).Streams)
			require.EqualValues(t, 4, lastRecord(t, p.srv).Streams)

			n, err = push(ctx, p.client, p.a, "/w/t", "b", "/t")
			require.NoError(t, err)
			require.Equal(t, 4, n)
			for _, rel := range []string{"a", "b/c", "z", "d"} {
				requireSameTensor(t, p.a, "/w/t/"+rel, p.b, "/t/"+rel)
			}
			require.EqualValues(t, 4, lastRecord(t, p.client).Streams)

			n, err = pull(ctx, p.client, p.a, "b", "/f", "/back/f")
			require.NoError(t, err)
			require.Equal(t, 1, n)
			requireSameTensor(t, p.a, "/w/f", p.a, "/back/f")
			require.EqualValues(t, 4, lastRecord(t, p.client).Streams)
			require.EqualValues(t, 4, lastRecord(t, p.srv).Streams)

			n, err = pull(ctx, p.client, p.a, "b", "/t", "/back/t")
			require.NoError(t, err)
			require.Equal(t, 4, n)
			for _, rel := range []string{"a", "b/c", "z", "d"} {
				requireSameTensor(t, p.a, "/w/t/"+rel, p.a, "/back/t/"+rel)
			}

			// A small copy takes one stream.
			p.a.put("/w/s", pattern(10, 4096))
			_, err = push(ctx, p.client, p.a, "/w/s", "b", "/s")
			require.NoError(t, err)
			require.EqualValues(t, 1, lastRecord(t, p.client).Streams)

			p.client.mu.Lock()
			idle := len(p.client.idle["b"])
			p.client.mu.Unlock()
			require.GreaterOrEqual(t, idle, 4, "the extra streams go back to the pool")
			st := p.client.Stats()
			require.EqualValues(t, 5, st.Copies.TCP)
			for _, r := range st.Transfers.Recent {
				require.Empty(t, r.Error)
			}
			switch {
			case v.inPlace && v.noCRC: // read straight into place
				require.NotZero(t, p.b.inPlaceChunks())
				require.NotZero(t, p.a.inPlaceChunks())
			case !v.inPlace:
				require.Zero(t, p.b.inPlaceChunks()+p.a.inPlaceChunks())
			}
			requireClean(t, p.a)
			requireClean(t, p.b)
		})
	}
}

// putStreams asks srv (on the authenticated raw connection c) for a put of
// metas over streams streams of chunk-byte chunks, and returns its reply.
func putStreams(t testing.TB, c *conn, path string, streams, chunk int, metas ...Meta) reply {
	t.Helper()
	require.NoError(t, c.sendJSON(frameRequest, request{Op: "put", Path: path, Tensors: metas, Streams: streams, Chunk: chunk}))
	var r reply
	require.NoError(t, c.recvJSON(frameOK, &r))
	return r
}

// joinRaw opens a raw authenticated connection to srv and joins it to the
// transfer of token.
func joinRaw(t testing.TB, srv *Service, token []byte) *conn {
	t.Helper()
	c := authed(t, srv)
	require.NoError(t, c.sendJSON(frameRequest, request{Op: "join", Path: "/", Token: token}))
	require.NoError(t, c.recvJSON(frameOK, nil))
	return c
}

// sendChunk sends chunk j (chunk bytes each) of data on c, with a CRC off
// by bad. Errors are the server's doing (it closes the extra streams at a
// failure): the test looks at its error frame.
func sendChunk(c *conn, data []byte, j, chunk int, bad uint32) {
	b := data[j*chunk : min((j+1)*chunk, len(data))]
	c.send(frameData, dataFrame(0, int64(j*chunk), b, crcOf(b)^bad))
	c.flush()
}

// A push whose extra streams misbehave fails as a whole, with the reason on
// the first connection, within the timeout, and leaves the destination as
// it was.
func TestParallelStreamFailures(t *testing.T) {
	const chunk = 64 << 10
	data := pattern(11, 16*chunk)
	m := Meta{DType: "U8", Shape: "1048576", NBytes: int64(len(data))}
	cases := []struct {
		name  string
		errno string
		msg   string
		// run sends the data given the first connection and two joined ones
		run func(t *testing.T, first, x, y *conn)
	}{
		{"killed extra stream", "EIO", "", func(t *testing.T, first, x, y *conn) {
			for j := range 6 {
				sendChunk(first, data, j, chunk, 0)
			}
			sendChunk(x, data, 6, chunk, 0)
			// y dies in the middle of a frame
			b := data[7*chunk : 8*chunk]
			_, err := y.c.Write(frameBytes(frameData, dataFrame(0, 7*chunk, b, crcOf(b)))[:1000])
			require.NoError(t, err)
			y.c.Conn.(*net.TCPConn).SetLinger(0)
			y.c.Close()
		}},
		{"corrupt chunk on an extra stream", "EIO", "checksum mismatch (crc32c)", func(t *testing.T, first, x, y *conn) {
			for j := range 16 {
				s := []*conn{first, x, y}[j%3]
				bad := uint32(0)
				if j == 9 {
					bad = 1
				}
				sendChunk(s, data, j, chunk, bad)
			}
			for i, s := range []*conn{first, x, y} {
				s.sendJSON(frameDone, doneMsg{Chunks: []int64{6, 5, 5}[i]}) // j%3 of 16
			}
		}},
		{"one chunk on two streams", "EPROTO", "twice", func(t *testing.T, first, x, y *conn) {
			sendChunk(first, data, 3, chunk, 0)
			sendChunk(y, data, 3, chunk, 0)
		}},
		{"chunk off the grid", "EPROTO", "chunks", func(t *testing.T, first, x, y *conn) {
			b := data[100 : 100+chunk]
			require.NoError(t, x.send(frameData, dataFrame(0, 100, b, crcOf(b))))
			require.NoError(t, x.flush())
		}},
		{"a stream sends nothing", "ETIMEDOUT", "", func(t *testing.T, first, x, y *conn) {
			for j := range 16 {
				sendChunk([]*conn{first, x}[j%2], data, j, chunk, 0)
			}
			require.NoError(t, first.sendJSON(frameDone, doneMsg{Chunks: 8}))
			require.NoError(t, x.sendJSON(frameDone, doneMsg{Chunks: 8}))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newMemLocal()
			b.inPlace = true
			b.put("/x", []byte("old contents"))
			srv := startServer(t, "b", b, testSecret, func(c *Config) { c.Timeout = time.Second })
			before := b.snapshot()
			first := authed(t, srv)
			r := putStreams(t, first, "/x", 3, chunk, m)
			require.Equal(t, 3, r.Streams)
			x := joinRaw(t, srv, r.Token)
			y := joinRaw(t, srv, r.Token)
			start := time.Now()
			tc.run(t, first, x, y)
			we := expectError(t, first)
			require.Equal(t, tc.errno, we.Errno, we.Message)
			require.Contains(t, we.Message, tc.msg)
			require.Less(t, time.Since(start), 3*time.Second, "the failure took longer than the timeout")
			first.c.Close()
			require.Equal(t, before, b.snapshot())
			requireClean(t, b)
			require.Zero(t, b.counts().Commits)
			require.Equal(t, 1, b.counts().Aborts)
			require.Eventually(t, func() bool { return srv.Stats().Transfers.Active == 0 }, 5*time.Second, 5*time.Millisecond)
			st := srv.Stats()
			require.Zero(t, st.Copies.TCP)
			require.NotEmpty(t, st.Transfers.Recent[0].Error)
			srv.mu.Lock()
			require.Empty(t, srv.pending, "the transfer's token is gone")
			srv.mu.Unlock()
		})
	}
}

// A join with a token no transfer has is refused (ENOENT); so is one past
// the streams the transfer takes (EBUSY).
func TestJoinRefused(t *testing.T) {
	b := newMemLocal()
	srv := startServer(t, "b", b, testSecret, nil)
	c := authed(t, srv)
	require.NoError(t, c.sendJSON(frameRequest, request{Op: "join", Path: "/", Token: []byte("no such token")}))
	we := expectError(t, c)
	require.Equal(t, "ENOENT", we.Errno)

	first := authed(t, srv)
	r := putStreams(t, first, "/x", 2, 64<<10, Meta{DType: "U8", Shape: "1048576", NBytes: 1 << 20})
	require.Equal(t, 2, r.Streams)
	joinRaw(t, srv, r.Token)
	extra := authed(t, srv)
	require.NoError(t, extra.sendJSON(frameRequest, request{Op: "join", Path: "/", Token: r.Token}))
	we = expectError(t, extra)
	require.Equal(t, "EBUSY", we.Errno)

	// another peer cannot join with a token it has seen
	stranger := rawClient(t, addrOf(srv))
	require.NoError(t, clientHandshake(stranger, "stranger", testSecret))
	require.NoError(t, stranger.sendJSON(frameRequest, request{Op: "join", Path: "/", Token: r.Token}))
	we = expectError(t, stranger)
	require.Equal(t, "ENOENT", we.Errno)
}

// A pull whose extra stream dies or carries a corrupt chunk fails with EIO
// and leaves the destination as it was.
func TestParallelPullFailures(t *testing.T) {
	const chunk = 4 << 10
	data := pattern(12, 16*chunk)
	m := Meta{DType: "U8", Shape: "65536", NBytes: int64(len(data))}
	for _, mode := range []string{"killed", "corrupt"} {
		t.Run(mode, func(t *testing.T) {
			addr := rawPeer(t, func(nc net.Conn, c *conn, req request) {
				switch req.Op {
				case "get":
					c.sendJSON(frameOK, reply{Tensors: []Meta{m}, Streams: 2, Token: []byte("tok"), Chunk: chunk})
					for j := 0; j < 16; j += 2 {
						b := data[j*chunk : (j+1)*chunk]
						c.send(frameData, dataFrame(0, int64(j*chunk), b, crcOf(b)))
					}
					c.sendJSON(frameDone, doneMsg{Chunks: 8})
					c.recv() // until the client hangs up
				case "join":
					c.sendJSON(frameOK, reply{})
					b := data[chunk : 2*chunk]
					if mode == "killed" {
						nc.Write(frameBytes(frameData, dataFrame(0, chunk, b, crcOf(b)))[:100])
						return
					}
					c.send(frameData, dataFrame(0, chunk, b, crcOf(b)+1))
					c.sendJSON(frameDone, doneMsg{Chunks: 1})
					c.recv()
				}
			})
			a := newMemLocal()
			a.inPlace = true
			a.put("/x", []byte("mine"))
			before := a.snapshot()
			cl := newClient(t, "a", a, testSecret, map[string]string{"b": addr}, func(c *Config) { c.Timeout = time.Second })
			start := time.Now()
			_, err := pull(context.Background(), cl, a, "b", "/x", "/x")
			requireErrno(t, err, syscall.EIO)
			require.Less(t, time.Since(start), 3*time.Second)
			require.Equal(t, before, a.snapshot())
			requireClean(t, a)
			require.Equal(t, 1, a.counts().Aborts)
			require.Zero(t, a.counts().Commits)
		})
	}
}

// The bitmap tracker: on the grid, each chunk once, the last one short.
func TestTrackerGrid(t *testing.T) {
	tr := newTracker("p", []Meta{{Rel: "a", NBytes: 10}, {Rel: "z", NBytes: 0}}, 4)
	require.NoError(t, tr.claim(0, 8, 2))
	require.NoError(t, tr.claim(0, 0, 4))
	requireErrno(t, tr.complete(), syscall.EIO)
	requireErrno(t, tr.claim(0, 0, 4), syscall.EPROTO) // twice
	requireErrno(t, tr.claim(0, 4, 3), syscall.EPROTO) // short, not the last
	requireErrno(t, tr.claim(0, 2, 4), syscall.EPROTO) // off the grid
	requireErrno(t, tr.claim(0, 8, 4), syscall.EPROTO) // past the end
	requireErrno(t, tr.claim(1, 0, 0), syscall.EPROTO) // an empty chunk
	requireErrno(t, tr.claim(2, 0, 1), syscall.EPROTO) // no such tensor
	require.NoError(t, tr.claim(0, 4, 4))
	require.NoError(t, tr.complete())
}

// TestRecvStreamFrameTypes: a data stream reads through the one frame
// reader and takes only what belongs in it: a lease channel's revoke (a
// known type, misplaced) and an unknown type alike end it out of step with
// EPROTO, while keepalives are skipped and a done frame ends it in step.
func TestRecvStreamFrameTypes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		in     []byte
		inStep bool
		errno  syscall.Errno
	}{
		{"done", frameBytes(frameDone, marshal(doneMsg{})), true, 0},
		{"revoke", frameBytes(frameRevoke, marshal(idsMsg{})), false, syscall.EPROTO},
		{"unknown", []byte{0, 0, 0, 1, byte(len(frameNames))}, false, syscall.EPROTO},
	} {
		t.Run(tc.name, func(t *testing.T) {
			near, far := net.Pipe()
			defer near.Close()
			defer far.Close()
			go far.Write(cat(frameBytes(frameKeepalive, nil), tc.in))
			c := newConn(near, 5*time.Second, "p")
			c.max = MaxFrame
			ss := &streamSet{dead: make(chan struct{})}
			rs := newRecvStream(c, ss, newTracker("p", []Meta{{}}, 0), nil, nil, recvMode{}, &Record{})
			require.Equal(t, tc.inStep, rs.run())
			_, err := ss.result()
			if tc.errno == 0 {
				require.NoError(t, err)
				return
			}
			require.Equal(t, tc.errno, Errno(err), "%v", err)
		})
	}
}

// TestChunkFor: a transfer takes the configured chunk size when it has
// chunksPerStream chunks a stream of it; a smaller one takes smaller
// chunks, in 64 KiB steps, down to minChunk, never above the configured
// size.
func TestChunkFor(t *testing.T) {
	s := &Service{cfg: Config{ChunkSize: 1 << 20, Streams: 2}}
	for _, c := range []struct {
		total int64
		want  int
	}{
		{4096, minChunk},
		{8 << 20, 256 << 10},
		{12 << 20, 384 << 10},
		{(32 << 20) - 1, 1 << 20},
		{32 << 20, 1 << 20},
		{1 << 30, 1 << 20},
	} {
		require.Equal(t, c.want, s.chunkFor(c.total), "total %d", c.total)
	}
	s.cfg.ChunkSize = 64 << 10 // below minChunk: the configured size wins
	require.Equal(t, 64<<10, s.chunkFor(8<<20))
	s.cfg.Streams = 0
	require.Equal(t, 64<<10, s.chunkFor(1<<30))
}

// A range-list pull (Pull.Spans) sends its spans in the get's table, and
// takes only the answer it asked for: a peer that answers with other
// spans, another size, no spans or a directory fails the pull with EPROTO
// before the destination is prepared. Where the bytes land is the puller's
// own list, so no answer can move them elsewhere.
func TestSpanPullHostileAnswers(t *testing.T) {
	spans := []Span{{Pos: 0, Src: 4096, Dst: 0, N: 4096}, {Pos: 4096, Src: 0, Dst: 65536, N: 4096}}
	good := Meta{DType: "U8", Shape: "8192", NBytes: 8192, InPlace: true, Spans: spans}
	shifted := good
	shifted.Spans = []Span{{Pos: 0, Src: 4096, Dst: 0, N: 4096}, {Pos: 4096, Src: 8192, Dst: 65536, N: 4096}}
	longer := good
	longer.NBytes, longer.Spans = 12288, append(append([]Span{}, spans...), Span{Pos: 8192, Src: 0, Dst: 0, N: 4096})
	bare := Meta{DType: "U8", Shape: "8192", NBytes: 8192}
	two := []SpanPull{{Path: "/kv", Dst: "/cache", Spans: spans}, {Path: "/kv2", Dst: "/cache2", Spans: spans}}
	for _, tc := range []struct {
		name  string
		lists []SpanPull
		r     reply
	}{
		{"other spans", two[:1], reply{Tensors: []Meta{shifted}}},
		{"more spans", two[:1], reply{Tensors: []Meta{longer}}},
		{"no spans", two[:1], reply{Tensors: []Meta{bare}}},
		{"a directory", two[:1], reply{Dir: true, Tensors: []Meta{withRel(good, "x")}}},
		{"fewer lists", two, reply{Tensors: []Meta{good}}},
		{"more lists", two[:1], reply{Tensors: []Meta{good, good}}},
		{"the second list wrong", two, reply{Tensors: []Meta{good, shifted}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			asked := make(chan request, 1)
			addr := rawPeer(t, func(_ net.Conn, c *conn, req request) {
				asked <- req
				c.sendJSON(frameOK, tc.r)
				c.recv() // until the client hangs up
			})
			a := newMemLocal()
			cl := newClient(t, "a", a, testSecret, map[string]string{"b": addr}, func(c *Config) { c.Timeout = time.Second })
			prepared := false
			_, err := cl.Receive(context.Background(), Pull{Peer: "b", Lists: tc.lists}, func(bool, []Meta) (Dest, error) {
				prepared = true
				return nil, errors.New("not to be prepared")
			})
			requireErrno(t, err, syscall.EPROTO)
			require.False(t, prepared, "the destination was prepared for a wrong answer")
			req := <-asked
			require.Equal(t, "get", req.Op)
			require.True(t, req.InPlace)
			require.Nil(t, req.Range)
			require.Equal(t, "/", req.Path, "the lists name their tensors below the root")
			require.Len(t, req.Tensors, len(tc.lists), "one descriptor a list")
			for i, l := range tc.lists {
				require.Equal(t, l.Path[1:], req.Tensors[i].Rel)
				require.Equal(t, spans, req.Tensors[i].Spans, "the spans travel in the request's table")
			}
		})
	}
	// A pull of lists with another range or path, an empty list, a list
	// without a tensor on either side or with a path that leaves the
	// mount, or spans out of step, is refused before anything is sent.
	cl := newClient(t, "a", newMemLocal(), testSecret, map[string]string{"b": "127.0.0.1:1"}, nil)
	for _, p := range []Pull{
		{Peer: "b", Lists: two, Range: Range{Set: true}},
		{Peer: "b", Lists: two, DstRange: Range{Set: true}},
		{Peer: "b", Lists: two, Path: "/kv"},
		{Peer: "b", Lists: two, Dst: "/c"},
		{Peer: "b", Lists: []SpanPull{}},
		{Peer: "b", Lists: []SpanPull{{Path: "/kv", Dst: "/c"}}},
		{Peer: "b", Lists: []SpanPull{{Path: "/kv", Spans: spans}}},
		{Peer: "b", Lists: []SpanPull{{Path: "/", Dst: "/c", Spans: spans}}},
		{Peer: "b", Lists: []SpanPull{two[0], {Path: "/a/../kv", Dst: "/c", Spans: spans}}},
		{Peer: "b", Lists: []SpanPull{{Path: "kv", Dst: "/c", Spans: spans}}},
		{Peer: "b", Lists: []SpanPull{two[0], {Path: "/kv", Dst: "/c", Spans: []Span{{Pos: 1, N: 1}}}}},
	} {
		_, err := cl.Receive(context.Background(), p, nil)
		requireErrno(t, err, syscall.EINVAL, "%+v", p)
	}
}
