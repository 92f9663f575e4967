package transfer

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

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
// again; the second, from snapshots, done.
func requireRechecked(t *testing.T, client *Service) {
	t.Helper()
	recent := client.Stats().Transfers.Recent
	require.Len(t, recent, 2, "%+v", recent)
	require.Contains(t, recent[0].Error, "checksum mismatch")
	require.Contains(t, recent[0].Error, "runs again from snapshots")
	require.Empty(t, recent[1].Error)
	require.Equal(t, int64(1), client.Stats().Copies.TCP)
}

// TestRecheckSourceWritten: a process writes the source through its
// mapping while a chunk is sent from there (testHookSentFrom, after the sum
// is taken): the chunk fails its sum at the receiver, which says the copy
// should run again (Error.recheck), and the client runs it again from
// snapshots (the source read through ReadAt), once. The destination then
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
			require.Equal(t, int64(rc.size), from.reads.Load(), "the second run read the source into snapshots, once")
			requireRechecked(t, client)
			requireClean(t, from)
			requireClean(t, to)
		})
	}
}

// TestRecheckDestinationWritten: a process (or another copy) writes the
// destination's bytes while a chunk lands there, before they are summed
// (testHookLanded): the chunk fails its sum, and the copy runs again from
// snapshots, read into buffers and checked there before they are written.
func TestRecheckDestinationWritten(t *testing.T) {
	for _, rc := range recheckCases() {
		t.Run(rc.String(), func(t *testing.T) {
			var once atomic.Bool
			testHookLanded = func(pieces [][]byte, n int64) {
				if n > 0 && once.CompareAndSwap(false, true) {
					pieces[0][0] ^= 0xff
				}
			}
			t.Cleanup(func() { testHookLanded = func([][]byte, int64) {} })
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
// hello.Recheck (a release before it) gets copies summed from snapshots:
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
	addr := rawServer(t, func(nc net.Conn) {
		defer nc.Close()
		c := wrapConn(nc, "raw")
		if serverHandshakeAs(c, "b", testSecret, challenge{Version: ProtocolVersion, XXH3: true, Recheck: true}) != nil {
			return
		}
		var req request
		if c.recvJSON(frameRequest, &req) != nil {
			return
		}
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
	require.Len(t, reqs, 2, "the get ran once summed in place and once from snapshots")
	require.True(t, reqs[0].Recheck)
	require.False(t, reqs[1].Recheck)
	require.Zero(t, a.counts().Commits)
	requireClean(t, a)
}
