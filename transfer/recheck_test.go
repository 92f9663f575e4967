package transfer

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// recheckChallenge is what a raw peer of this release says of itself: it
// takes XXH3 and copies summed where their bytes lie.
var recheckChallenge = challenge{Version: ProtocolVersion, XXH3: true, Recheck: true}

// flipLandedOnce makes the first read that lands bytes of a chunk summed
// in place flip one of them before they are summed (testHookLanded), as a
// process writing the destination through its mapping may; it says
// whether that happened.
func flipLandedOnce(t *testing.T) *atomic.Bool {
	var once atomic.Bool
	testHookLanded = func(pieces [][]byte, n int64) {
		if n > 0 && once.CompareAndSwap(false, true) {
			pieces[0][0] ^= 0xff
		}
	}
	t.Cleanup(func() { testHookLanded = func([][]byte, int64) {} })
	return &once
}

// recheckCase is one copy of TestRecheck*: a push or a pull, of a small
// tensor (one inline chunk, sent behind the request) or a large one (many
// chunks over several streams).
type recheckCase struct {
	pull bool
	size int
}

func recheckCases() []recheckCase {
	var cs []recheckCase
	for _, pull := range []bool{false, true} {
		for _, size := range []int{4096 + 3, 3<<20 + 5} {
			cs = append(cs, recheckCase{pull, size})
		}
	}
	return cs
}

func (rc recheckCase) String() string {
	if rc.pull {
		return fmt.Sprintf("pull,%d", rc.size)
	}
	return fmt.Sprintf("push,%d", rc.size)
}

// run copies /x from its source node to /y on the other (in place,
// written chunk by chunk into the destination's memory) with both nodes'
// sources in host memory, and returns the two nodes (source, destination)
// and the client.
func (rc recheckCase) run(t *testing.T, data []byte) (from, to *memLocal, client *Service, err error) {
	p := &pair{a: newMemLocal(), b: newMemLocal()}
	p.a.hostMem, p.b.hostMem, p.a.inPlace, p.b.inPlace = true, true, true, true
	p.srv = startServer(t, "b", p.b, testSecret, func(c *Config) { c.ChunkSize = 256 << 10 })
	p.client = newClient(t, "a", p.a, testSecret, map[string]string{"b": addrOf(p.srv)}, func(c *Config) { c.ChunkSize = 256 << 10 })
	ctx := context.Background()
	if rc.pull {
		p.b.put("/x", data)
		_, err = pull(ctx, p.client, p.a, "b", "/x", "/y")
		return p.b, p.a, p.client, err
	}
	p.a.put("/x", data)
	_, err = push(ctx, p.client, p.a, "/x", "b", "/y")
	return p.a, p.b, p.client, err
}

// requireRechecked checks the client's records of a copy that ran twice:
// the first summed where its bytes lie, failed on a sum and said it runs
// again; the second, from buffers, done.
func requireRechecked(t *testing.T, client *Service) {
	t.Helper()
	recent := client.Stats().Transfers.Recent
	require.Len(t, recent, 2, "%+v", recent)
	require.Contains(t, recent[0].Error, "checksum mismatch")
	require.Contains(t, recent[0].Error, "runs again from buffers")
	require.Empty(t, recent[1].Error)
	require.Equal(t, int64(1), client.Stats().Copies.TCP)
	require.Equal(t, int64(1), client.Stats().Copies.Rechecked)
}

// TestRecheckSourceWritten: a process writes the source through its
// mapping while a chunk is sent from there (testHookSentFrom, after the sum
// is taken): the chunk fails its sum at the receiver, which says the copy
// should run again (Error.recheck), and the client runs it again from
// buffers (the source read through ReadAt), once. The destination then
// holds the source as it is now; both nodes end clean.
func TestRecheckSourceWritten(t *testing.T) {
	for _, rc := range recheckCases() {
		t.Run(rc.String(), func(t *testing.T) {
			var once atomic.Bool
			testHookSentFrom = func(pieces [][]byte) {
				if once.CompareAndSwap(false, true) {
					pieces[len(pieces)-1][0] ^= 0xff
				}
			}
			t.Cleanup(func() { testHookSentFrom = func([][]byte) {} })
			from, to, client, err := rc.run(t, pattern(41, rc.size))
			require.NoError(t, err)
			require.True(t, once.Load(), "a chunk was sent from the source's memory")
			requireSameTensor(t, from, "/x", to, "/y")
			require.NotEqual(t, pattern(41, rc.size), from.files["/x"].data, "the source was written during the copy")
			require.Equal(t, int64(rc.size), from.reads.Load(), "the second run read the source into buffers, once")
			requireRechecked(t, client)
			requireClean(t, from)
			requireClean(t, to)
		})
	}
}

// TestRecheckDestinationWritten: a process (or another copy) writes the
// destination's bytes while a chunk lands there, before they are summed
// (testHookLanded): the chunk fails its sum, and the copy runs again from
// buffers: read into them and checked there before they are written.
func TestRecheckDestinationWritten(t *testing.T) {
	for _, rc := range recheckCases() {
		t.Run(rc.String(), func(t *testing.T) {
			once := flipLandedOnce(t)
			data := pattern(42, rc.size)
			from, to, client, err := rc.run(t, data)
			require.NoError(t, err)
			require.True(t, once.Load(), "a chunk landed in the destination's memory")
			require.Equal(t, data, to.files["/y"].data)
			requireRechecked(t, client)
			requireClean(t, from)
			requireClean(t, to)
		})
	}
}

// TestRecheckNotAskedFromOlderPeers: a peer that says nothing of
// hello.Recheck (a release before it) gets copies summed from buffers:
// the request does not ask for it, and the chunks sent to it are read
// through ReadAt.
func TestRecheckNotAskedFromOlderPeers(t *testing.T) {
	a := newMemLocal()
	a.hostMem = true
	data := pattern(43, 3<<20+1)
	a.put("/x", data)
	var req atomic.Pointer[request]
	addr := rawPeer(t, func(nc net.Conn, c *conn, r request) {
		req.Store(&r)
		c.sendError(&Error{Errno: syscall.EACCES, Msg: "refused"})
	})
	client := newClient(t, "a", a, testSecret, map[string]string{"b": addr}, nil)
	_, err := push(context.Background(), client, a, "/x", "b", "/y")
	require.Error(t, err)
	require.NotNil(t, req.Load())
	require.False(t, req.Load().Recheck, "a put to an older peer asked for Recheck")
	_, err = pull(context.Background(), client, a, "b", "/x", "/z")
	require.Error(t, err)
	require.False(t, req.Load().Recheck, "a get from an older peer asked for Recheck")
}

// TestRecheckOnce: a peer whose chunks always fail their sums (corrupted
// on the way, not by a writer): the client's first get asks for Recheck,
// fails on a sum, and asks once more without it; that one's mismatch is
// the copy's error, EIO, and nothing is committed.
func TestRecheckOnce(t *testing.T) {
	data := pattern(44, 64<<10)
	var reqs []request
	reqc := make(chan request, 4)
	addr := rawPeerAs(t, recheckChallenge, func(_ net.Conn, c *conn, req request) {
		reqc <- req
		m := Meta{DType: "U8", Shape: fmt.Sprint(len(data)), NBytes: int64(len(data))}
		if c.sendJSON(frameOK, reply{Tensors: []Meta{m}}) != nil {
			return
		}
		h := chunkHeader{sum: ChecksumXXH3.sum(data) ^ 1, kind: ChecksumXXH3}
		c.send(frameData, sumFrame(h, data))
		c.sendJSON(frameDone, doneMsg{Chunks: 1})
		// Until the client hangs up.
		c.recv()
	})
	a := newMemLocal()
	a.inPlace = true
	client := newClient(t, "a", a, testSecret, map[string]string{"b": addr}, nil)
	_, err := pull(context.Background(), client, a, "b", "/x", "/y")
	requireErrno(t, err, syscall.EIO)
	require.Contains(t, err.Error(), "checksum mismatch (xxh3)")
	require.NotContains(t, err.Error(), "runs again")
	close(reqc)
	for r := range reqc {
		reqs = append(reqs, r)
	}
	require.Len(t, reqs, 2, "the get ran once summed in place and once from buffers")
	require.True(t, reqs[0].Recheck)
	require.False(t, reqs[1].Recheck)
	require.Zero(t, a.counts().Commits)
	requireClean(t, a)
}

// recheckThenGone is a peer "b" that says Recheck in its challenge, answers
// its first request with an error frame flagged recheck, and stops
// listening: the client's second attempt cannot connect.
func recheckThenGone(t *testing.T, served *atomic.Int32) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		ln.Close() // the next dial is refused
		defer nc.Close()
		c, _, ok := rawRequest(nc, recheckChallenge)
		if !ok {
			return
		}
		served.Add(1)
		c.sendJSON(frameError, wireError{Errno: "EIO", Message: "mismatch", Recheck: true})
		c.recv()
	}()
	return ln.Addr().String()
}

// TestRecheckRedialFails: a copy whose first attempt fails for a
// recheck reason and whose second connection cannot be made must return an
// error (ECONNREFUSED), not panic.
func TestRecheckRedialFails(t *testing.T) {
	for _, pullCase := range []bool{false, true} {
		var served atomic.Int32
		addr := recheckThenGone(t, &served)
		a := newMemLocal()
		a.put("/x", pattern(1, 4096))
		client := newClient(t, "a", a, testSecret, map[string]string{"b": addr}, nil)
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("pull=%v: panic: %v", pullCase, r)
				}
			}()
			if pullCase {
				_, err = pull(context.Background(), client, a, "b", "/x", "/y")
			} else {
				_, err = push(context.Background(), client, a, "/x", "b", "/y")
			}
		}()
		require.Equal(t, int32(1), served.Load())
		if !t.Failed() {
			requireErrno(t, err, syscall.ECONNREFUSED)
		}
	}
}

// slowAbort is a Local whose destinations take d to abort (a large
// tensor's temporaries let go, a loaded host).
type slowAbort struct {
	*memLocal
	d time.Duration
}

type slowAbortDest struct {
	*memDest
	d time.Duration
}

func (l slowAbort) Put(p string, isDir bool, metas []Meta) (Dest, error) {
	d, err := l.memLocal.Put(p, isDir, metas)
	if err != nil {
		return nil, err
	}
	return slowAbortDest{d.(*memDest), l.d}, nil
}

func (d slowAbortDest) Abort() {
	time.Sleep(d.d)
	d.memDest.Abort()
}

// TestRecheckPushSlowAbort: a multi-stream push summed in place
// whose chunk fails its sum at the destination (a write into the
// destination as it lands) must run again from buffers and succeed,
// however long the destination's abort takes: the destination closes
// the extra streams at the failure, and the sender's broken pipe must not
// stand in for the recheck error.
func TestRecheckPushSlowAbort(t *testing.T) {
	for _, delay := range []time.Duration{0, 300 * time.Millisecond, time.Second} {
		t.Run(delay.String(), func(t *testing.T) {
			once := flipLandedOnce(t)
			a, b := newMemLocal(), newMemLocal()
			a.hostMem, a.inPlace, b.hostMem, b.inPlace = true, true, true, true
			mod := func(c *Config) { c.ChunkSize = 256 << 10 }
			srv := startServer(t, "b", slowAbort{b, delay}, testSecret, mod)
			client := newClient(t, "a", a, testSecret, map[string]string{"b": addrOf(srv)}, mod)
			data := pattern(46, 64<<20+5)
			a.put("/x", data)
			_, err := push(context.Background(), client, a, "/x", "b", "/y")
			require.True(t, once.Load())
			require.NoError(t, err, "records: %+v", client.Stats().Transfers.Recent)
			got, _, _ := b.get("/y")
			require.Equal(t, data, got)
			requireClean(t, a)
			requireClean(t, b)
		})
	}
}

// TestRecheckThenCancel: a pull between two real services whose
// first attempt fails its sum in place (a write into the destination as it
// lands) while the copy is being cancelled (the user's ^C): the copy must
// end with its error, not panic.
func TestRecheckThenCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var once atomic.Bool
	testHookLanded = func(pieces [][]byte, n int64) {
		if n > 0 && once.CompareAndSwap(false, true) {
			pieces[0][0] ^= 0xff
			cancel()
		}
	}
	t.Cleanup(func() { testHookLanded = func([][]byte, int64) {} })
	p := &pair{a: newMemLocal(), b: newMemLocal()}
	p.a.inPlace = true
	p.srv = startServer(t, "b", p.b, testSecret, nil)
	p.client = newClient(t, "a", p.a, testSecret, map[string]string{"b": addrOf(p.srv)}, nil)
	p.b.put("/x", pattern(47, 4096))
	var err error
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("panic: %v", r)
			}
		}()
		_, err = pull(ctx, p.client, p.a, "b", "/x", "/y")
	}()
	require.Error(t, err)
	requireClean(t, p.a)
}

// TestRecheckReasonLate: a destination that takes a multi-stream
// put summed in place, fails a chunk's sum (a write into the source during
// the copy), drops the put's extra stream at once, and sends its reason
// (flagged recheck) on the put's own connection 300 ms later, after its
// abort (a tree of thousands of temporaries let go): the sender must run
// the copy again from buffers, not report the broken stream (EIO).
func TestRecheckReasonLate(t *testing.T) {
	var puts atomic.Int32
	addr := rawPeerAs(t, recheckChallenge, func(_ net.Conn, c *conn, req request) {
		switch {
		case req.Op == "join":
			// Failed: the extra streams are closed with data unread.
			return
		case puts.Add(1) == 1:
			// The first stream reads on, discarding, until the sender's
			// end; the reason goes out once the abort is over.
			go func() {
				time.Sleep(300 * time.Millisecond)
				c.sendJSON(frameError, wireError{Errno: "EIO", Message: "checksum mismatch (summed where the bytes lie)", Recheck: true})
			}()
			for {
				typ, _, err := c.recv()
				if err != nil || typ == frameDone {
					break
				}
			}
			time.Sleep(time.Second)
		default:
			c.sendJSON(frameError, wireError{Errno: "EACCES", Message: "second attempt seen"})
			c.recv()
		}
	})
	a := newMemLocal()
	a.hostMem = true
	a.put("/x", pattern(51, 32<<20))
	client := newClient(t, "a", a, testSecret, map[string]string{"b": addr}, nil)
	_, err := push(context.Background(), client, a, "/x", "b", "/y")
	t.Logf("err: %v; puts: %d", err, puts.Load())
	require.Equal(t, int32(2), puts.Load(), "the copy ran again from buffers")
	requireClean(t, a)
}
