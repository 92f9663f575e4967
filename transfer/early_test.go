package transfer

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestEarlyPut: a put of several streams sends its data right behind its
// request (request.Early), and its extra stream joins with the sender's
// token and sends at once: here the join even comes before the put, and
// waits for it. The server answers nothing until its final reply.
func TestEarlyPut(t *testing.T) {
	const chunk = 1 << 10
	data := pattern(31, 8*chunk) // 8 chunks: 2 streams of 4 (streamsFor)
	require.Equal(t, 2, streamsFor(int64(len(data)), 2, chunk))
	b := newMemLocal()
	b.put("/x", make([]byte, len(data)))
	srv := startServer(t, "b", b, testSecret, nil)
	ctl, extra := authed(t, srv), authed(t, srv)
	token := nonce()
	// The join first: the server holds it until the put registers.
	require.NoError(t, extra.sendJSON(frameRequest, request{Op: "join", Path: "/", Token: token, Early: true}))
	for j := 1; j < 8; j += 2 {
		require.NoError(t, extra.send(frameData, dataFrame(0, int64(j*chunk), data[j*chunk:(j+1)*chunk], crcOf(data[j*chunk:(j+1)*chunk]))))
	}
	require.NoError(t, extra.sendJSON(frameDone, doneMsg{Chunks: 4}))
	require.Eventually(t, func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.pendingAdded != nil // the join waits for its put
	}, 5*time.Second, time.Millisecond)
	m := Meta{DType: "U8", Shape: "8192", NBytes: int64(len(data))}
	require.NoError(t, ctl.sendJSON(frameRequest, request{Op: "put", Path: "/x", Tensors: []Meta{m}, Streams: 2, Chunk: chunk, Early: true, Token: token}))
	for j := 0; j < 8; j += 2 {
		require.NoError(t, ctl.send(frameData, dataFrame(0, int64(j*chunk), data[j*chunk:(j+1)*chunk], crcOf(data[j*chunk:(j+1)*chunk]))))
	}
	require.NoError(t, ctl.sendJSON(frameDone, doneMsg{Chunks: 4}))
	require.NoError(t, ctl.flush())
	var r reply
	require.NoError(t, ctl.recvJSON(frameOK, &r), "the first frame the server sends is its final reply")
	require.Equal(t, 1, r.Copied)
	got, _, _ := b.get("/x")
	require.Equal(t, data, got)
	requireClean(t, b)
}

// TestEarlyPutRefusals: an early put that cannot be one (a single stream's
// worth of data, a token of the wrong size, one in use) is EPROTO and its
// connection dropped; an early join whose put never comes is refused
// (ENOENT) once the timeout passes, and dropped.
func TestEarlyPutRefusals(t *testing.T) {
	const chunk = 1 << 10
	b := newMemLocal()
	srv := startServer(t, "b", b, testSecret, func(c *Config) { c.Timeout = 300 * time.Millisecond })
	m := Meta{DType: "U8", Shape: "8192", NBytes: 8 * chunk}
	for _, tc := range []struct {
		name string
		req  request
	}{
		{"one stream", request{Op: "put", Path: "/x", Tensors: []Meta{m}, Streams: 1, Chunk: chunk, Early: true, Token: nonce()}},
		{"short token", request{Op: "put", Path: "/x", Tensors: []Meta{m}, Streams: 2, Chunk: chunk, Early: true, Token: []byte("short")}},
	} {
		c := authed(t, srv)
		require.NoError(t, c.sendJSON(frameRequest, tc.req))
		we := expectError(t, c)
		require.Equal(t, "EPROTO", we.Errno, tc.name)
		expectClosed(t, c, 2*time.Second)
	}
	// A token in use: a join holds none, a put registers it; a second put
	// with it is refused while the first waits for its data.
	token := nonce()
	first := authed(t, srv)
	require.NoError(t, first.sendJSON(frameRequest, request{Op: "put", Path: "/x", Tensors: []Meta{m}, Streams: 2, Chunk: chunk, Early: true, Token: token}))
	require.Eventually(t, func() bool { return srv.findPending(string(token), false, 0) != nil }, 5*time.Second, time.Millisecond, "the first put registers its token")
	second := authed(t, srv)
	require.NoError(t, second.sendJSON(frameRequest, request{Op: "put", Path: "/y", Tensors: []Meta{m}, Streams: 2, Chunk: chunk, Early: true, Token: token}))
	we := expectError(t, second)
	require.Equal(t, "EPROTO", we.Errno)
	require.Contains(t, we.Message, "in use")
	expectClosed(t, second, 2*time.Second)

	lone := authed(t, srv)
	start := time.Now()
	require.NoError(t, lone.sendJSON(frameRequest, request{Op: "join", Path: "/", Token: nonce(), Early: true}))
	we = expectError(t, lone)
	require.Equal(t, "ENOENT", we.Errno)
	require.GreaterOrEqual(t, time.Since(start), 250*time.Millisecond, "the join waited for its put")
	expectClosed(t, lone, 2*time.Second)
	first.c.Close()
	requireClean(t, b)
}

// TestEarlyJoinAfterItsPutEnded: an early join that comes after its put
// ended, refused before it registered (a bad descriptor list) or failed after
// (a chunk that fails its sum), is refused at once (ENOENT), where it
// waited out the timeout (an hour here) for a put that would never
// register, and the server's Close waited for it.
func TestEarlyJoinAfterItsPutEnded(t *testing.T) {
	const chunk = 1 << 10
	data := pattern(33, 8*chunk)
	m := Meta{DType: "U8", Shape: "8192", NBytes: int64(len(data))}
	for _, tc := range []struct {
		name string
		meta Meta
		bad  bool // a chunk that fails its sum, after the put registered
	}{
		{"refused", Meta{Rel: "a", DType: "U8", Shape: "8192", NBytes: int64(len(data))}, false}, // a file copy names no tensor
		{"failed", m, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newMemLocal()
			b.put("/x", make([]byte, len(data)))
			srv := startServer(t, "b", b, testSecret, func(c *Config) { c.Timeout = time.Hour })
			ctl := authed(t, srv)
			token := nonce()
			require.NoError(t, ctl.sendJSON(frameRequest, request{Op: "put", Path: "/x", Tensors: []Meta{tc.meta}, Streams: 2, Chunk: chunk, Early: true, Token: token}))
			if tc.bad {
				require.NoError(t, ctl.send(frameData, dataFrame(0, 0, data[:chunk], crcOf(data[:chunk])^1)))
				require.NoError(t, ctl.flush())
			}
			expectError(t, ctl)
			ctl.c.Close() // as a sender does that hears of the failure
			require.Eventually(t, func() bool {
				srv.mu.Lock()
				defer srv.mu.Unlock()
				_, ended := srv.ended[string(token)]
				return ended
			}, 10*time.Second, time.Millisecond, "the put ends")
			extra := authed(t, srv)
			require.NoError(t, extra.sendJSON(frameRequest, request{Op: "join", Path: "/", Token: token, Early: true}))
			// An hour's wait would end the test's run, not this deadline.
			extra.c.SetReadDeadline(time.Now().Add(time.Minute))
			we := expectError(t, extra)
			require.Equal(t, "ENOENT", we.Errno)
			requireClean(t, b)
		})
	}
}

// TestStalledChunkHoldsNothing: a sender that stops in the middle of a
// chunk does not keep the receiver inside the destination's fill (which
// holds a real tensor's lock: an rm of the copy's destination waited for
// the whole timeout behind it); the chunk completes when the rest comes.
func TestStalledChunkHoldsNothing(t *testing.T) {
	b := newMemLocal()
	b.inPlace = true
	b.put("/x", make([]byte, 64<<10))
	srv := startServer(t, "b", b, testSecret, nil)
	c := authed(t, srv)
	data := pattern(32, 64<<10)
	putRequest(t, c, "/x", Meta{DType: "U8", Shape: "65536", NBytes: int64(len(data))})
	rest := sendHalfChunk(t, c, data)
	time.Sleep(200 * time.Millisecond) // the receiver has half the chunk
	require.Zero(t, b.inFill.Load(), "the receiver waits for the rest inside the destination's fill")
	finishHalfChunk(t, c, rest, b, data)
}

// sendHalfChunk writes the data frame of data (chunk 0 of tensor 0, with
// its CRC32C) on c up to half of data, and returns the rest to write.
func sendHalfChunk(t testing.TB, c *conn, data []byte) (rest []byte) {
	t.Helper()
	frame := dataFrame(0, 0, data, crcOf(data))
	var hdr [frameHeaderLen]byte
	putFrameHeader(hdr[:], frameData, len(frame))
	half := dataHeaderLen + len(data)/2
	_, err := c.c.Write(append(hdr[:], frame[:half]...))
	require.NoError(t, err)
	return frame[half:]
}

// finishHalfChunk writes the rest of sendHalfChunk's chunk and ends the
// put, which must then succeed with b's /x holding data and b clean.
func finishHalfChunk(t testing.TB, c *conn, rest []byte, b *memLocal, data []byte) {
	t.Helper()
	_, err := c.c.Write(rest)
	require.NoError(t, err)
	require.NoError(t, c.sendJSON(frameDone, doneMsg{Chunks: 1}))
	require.NoError(t, c.recvJSON(frameOK, nil))
	got, _, _ := b.get("/x")
	require.Equal(t, data, got)
	requireClean(t, b)
}

// slowPut is a Local whose Put takes d first (a destination allocating
// gigabytes, its pages committed).
type slowPut struct {
	*memLocal
	d time.Duration
}

func (l slowPut) Put(p string, isDir bool, metas []Meta) (Dest, error) {
	time.Sleep(l.d)
	return l.memLocal.Put(p, isDir, metas)
}

// TestEarlyPutSlowPrepare: an early put's data goes out before the
// destination is ready; while the destination prepares for three times
// the timeout it reads nothing, and its keepalives move the sender's write
// deadlines on (each stream's, blocked in a full socket). Before, the
// sender's writes timed out (ETIMEDOUT): a 3 GiB put under --timeout
// 300ms failed that way.
func TestEarlyPutSlowPrepare(t *testing.T) {
	const timeout = 300 * time.Millisecond
	mod := func(c *Config) { c.Timeout, c.Streams = timeout, 4 }
	srv := startServer(t, "b", slowPut{newMemLocal(), 3 * timeout}, testSecret, mod)
	a := newMemLocal()
	data := pattern(41, 96<<20) // far more than the sockets hold
	a.put("/big", data)
	cl := newClient(t, "a", a, testSecret, map[string]string{"b": addrOf(srv)}, mod)
	require.Greater(t, streamsFor(int64(len(data)), 4, cl.chunkFor(int64(len(data)))), 1, "an early put")
	n, err := push(context.Background(), cl, a, "/big", "b", "/big")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	requireSameTensor(t, a, "/big", srv.local.(slowPut).memLocal, "/big")
}

// TestTCPPullSlowPrepare: a TCP pull of a whole tensor whose destination
// prepares for three times the timeout (allocating): the server's data
// waits for the puller's go-ahead (reply.WaitGo) while the puller's
// keepalives say it is alive, then goes on every stream. Before, the
// server sent at once: its extra streams' joins came after it stopped
// waiting for them (ETIMEDOUT there; ENOENT here, "no transfer to join
// with that token"), and a single stream's writes timed out. A prepare
// that fails calls the data off with its error, and the next pull works.
func TestTCPPullSlowPrepare(t *testing.T) {
	const timeout = 300 * time.Millisecond
	mod := func(c *Config) { c.Timeout, c.Streams = timeout, 4 }
	b := newMemLocal()
	data := pattern(43, 96<<20) // far more than the sockets hold
	b.put("/big", data)
	srv := startServer(t, "b", b, testSecret, mod)
	a := newMemLocal()
	cl := newClient(t, "a", a, testSecret, map[string]string{"b": addrOf(srv)}, mod)
	ctx := context.Background()
	n, err := cl.Receive(ctx, Pull{Peer: "b", Path: "/big", Dst: "/got"}, func(isDir bool, metas []Meta) (Dest, error) {
		time.Sleep(3 * timeout)
		return a.Put("/got", isDir, metas)
	})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	requireSameTensor(t, a, "/got", b, "/big")
	_, err = cl.Receive(ctx, Pull{Peer: "b", Path: "/big", Dst: "/x"}, func(bool, []Meta) (Dest, error) {
		return nil, &Error{Errno: syscall.ENOSPC, Msg: "full"}
	})
	requireErrno(t, err, syscall.ENOSPC)
	n, err = pull(ctx, cl, a, "b", "/big", "/again")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	requireClean(t, a)
	requireClean(t, b)
}

// TestGetGoAhead: a TCP get of whole tensors waits for the puller's
// go-ahead only when it is large (more than goAheadMin bytes, or several
// streams): a small one's data follows the answer at once (a go-ahead
// cost a 4 KiB pull a round trip); an in-place get never waits. A puller
// that calls the data off with its error leaves the connection in step.
func TestGetGoAhead(t *testing.T) {
	b := newMemLocal()
	b.put("/small", pattern(44, 4096))
	b.put("/large", pattern(45, goAheadMin+1))
	srv := startServer(t, "b", b, testSecret, nil)
	c := rawClient(t, addrOf(srv))
	require.NoError(t, clientHandshake(c, "a", testSecret))
	c.max = MaxFrame // data frames
	for _, tc := range []struct {
		path    string
		inPlace bool
		wait    bool
	}{{"/large", false, true}, {"/large", true, false}, {"/small", false, false}} {
		require.NoError(t, c.sendJSON(frameRequest, request{Op: "get", Path: tc.path, InPlace: tc.inPlace}), tc.path)
		var r reply
		require.NoError(t, c.recvJSON(frameOK, &r), tc.path)
		require.Equal(t, tc.wait, r.WaitGo, "%s in place %v", tc.path, tc.inPlace)
		if r.WaitGo {
			c.sendError(&Error{Errno: syscall.ENOSPC, Msg: "no room here"})
			continue
		}
		// The data is coming: read it to the done frame.
		for {
			typ, _, err := c.recv()
			require.NoError(t, err)
			if typ == frameDone {
				break
			}
		}
	}
	requireClean(t, b)
}

// TestEarlyTokenRefusedNotKept: an early put whose token is not a token
// (megabytes: refused, EPROTO) leaves nothing in Service.ended, which kept
// each such token whole for the timeout (a breaker's finding: 24 MiB for
// eight requests of an authenticated peer).
func TestEarlyTokenRefusedNotKept(t *testing.T) {
	b := newMemLocal()
	srv := startServer(t, "b", b, testSecret, nil)
	const chunk = 1 << 10
	m := Meta{DType: "U8", Shape: "8192", NBytes: 8 * chunk}
	for i := range 8 {
		c := authed(t, srv)
		tok := make([]byte, 3<<20)
		tok[0] = byte(i)
		require.NoError(t, c.sendJSON(frameRequest, request{Op: "put", Path: "/x", Tensors: []Meta{m}, Streams: 2, Chunk: chunk, Early: true, Token: tok}))
		we := expectError(t, c)
		require.Equal(t, "EPROTO", we.Errno)
		expectClosed(t, c, 5*time.Second) // servePut has returned
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	require.Empty(t, srv.ended, "refused tokens are kept")
}
