package transfer

import (
	"bytes"
	"context"
	"crypto/hmac"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	flag.Parse()
	if !testing.Verbose() {
		log.SetOutput(io.Discard) // the service logs every refused peer
	}
	os.Exit(m.Run())
}

var (
	testSecret  = []byte("tensorfs-test-secret-0123456789")
	otherSecret = []byte("another-secret-entirely-9876543")
)

// ---- helpers ---------------------------------------------------------------

// startServer starts a listening service on 127.0.0.1:0 over local.
func startServer(t testing.TB, name string, local Local, secret []byte, mod func(*Config)) *Service {
	t.Helper()
	cfg := Config{Name: name, HostID: "host-" + name, Listen: "127.0.0.1:0", Secret: secret, Timeout: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg, local)
	require.NoError(t, err)
	require.NoError(t, s.Start())
	t.Cleanup(func() { s.Close() })
	return s
}

// newClient makes a service that only dials (no Listen), knowing peers.
func newClient(t testing.TB, name string, local Local, secret []byte, peers map[string]string, mod func(*Config)) *Service {
	t.Helper()
	cfg := Config{Name: name, HostID: "host-" + name, Secret: secret, Peers: peers, Timeout: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg, local)
	require.NoError(t, err)
	require.NoError(t, s.Start())
	t.Cleanup(func() { s.Close() })
	return s
}

func addrOf(s *Service) string { return s.Addr().String() }

// push sends the tensors at src in from to peer:dst, the way the fs layer
// does: Get, Send, close the sources.
func push(ctx context.Context, c *Service, from *memLocal, src, peer, dst string) (int, error) {
	srcs, isDir, err := from.Get(src, Range{})
	if err != nil {
		return 0, err
	}
	defer func() {
		for _, s := range srcs {
			s.Close()
		}
	}()
	return c.Send(ctx, peer, dst, srcs, isDir, src)
}

// pull receives peer:remote into dst of into.
func pull(ctx context.Context, c *Service, into *memLocal, peer, remote, dst string) (int, error) {
	return c.Receive(ctx, Pull{Peer: peer, Path: remote, Dst: dst}, func(isDir bool, metas []Meta) (Dest, error) {
		return into.Put(dst, isDir, metas)
	})
}

func pattern(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

func requireErrno(t testing.TB, err error, want syscall.Errno, msgAndArgs ...any) {
	t.Helper()
	require.Error(t, err, msgAndArgs...)
	require.Truef(t, errors.Is(err, want), "want %v (%d), got error %q of type %T, errno %v", want.Error(), int(want), err, err, Errno(err))
}

// requireClean waits for a local's handlers to finish and checks nothing
// leaked: every source closed, every destination committed or aborted, no
// misuse.
func requireClean(t testing.TB, l *memLocal) {
	t.Helper()
	require.Eventually(t, func() bool {
		c := l.counts()
		return c.OpenSrcs == 0 && c.OpenDests == 0
	}, 5*time.Second, 5*time.Millisecond, "sources or destinations left open: %+v", l.counts())
	c := l.counts()
	require.Empty(t, c.Misuse)
	require.Zero(t, c.BadWrites, "writes outside a tensor reached the Local")
}

func requireSameTensor(t testing.TB, a *memLocal, pa string, b *memLocal, pb string) {
	t.Helper()
	da, ma, ok := a.get(pa)
	require.True(t, ok, "%s missing", pa)
	db, mb, ok := b.get(pb)
	require.True(t, ok, "%s missing", pb)
	require.Equal(t, ma, mb, "meta of %s vs %s", pa, pb)
	require.True(t, bytes.Equal(da, db), "bytes of %s (%d) vs %s (%d) differ", pa, len(da), pb, len(db))
}

// pair is a server node "b" and a client node "a" that knows it.
type pair struct {
	a, b   *memLocal
	srv    *Service // b's listener
	client *Service // a's dialer, Peers{"b": srv}
}

func newPair(t testing.TB, mod func(*Config)) *pair {
	p := &pair{a: newMemLocal(), b: newMemLocal()}
	p.srv = startServer(t, "b", p.b, testSecret, mod)
	p.client = newClient(t, "a", p.a, testSecret, map[string]string{"b": addrOf(p.srv)}, mod)
	return p
}

// ---- raw peers -------------------------------------------------------------

func wrapConn(nc net.Conn, peer string) *conn {
	return newConn(nc, 5*time.Second, peer)
}

// rawClient dials addr and speaks the protocol by hand.
func rawClient(t testing.TB, addr string) *conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	return wrapConn(nc, "server")
}

// clientHandshake authenticates c as client name with secret.
func clientHandshake(c *conn, name string, secret []byte) error {
	cn := nonce()
	if err := c.sendJSON(frameHello, hello{Version: ProtocolVersion, Name: name, HostID: "raw", Nonce: cn}); err != nil {
		return err
	}
	var ch challenge
	if err := c.recvJSON(frameChallenge, &ch); err != nil {
		return err
	}
	if err := c.sendJSON(frameAuth, authMsg{Proof: proof(secret, "client", cn, ch.Nonce, name, ch.Name)}); err != nil {
		return err
	}
	return c.recvJSON(frameOK, nil)
}

// serverHandshake authenticates an accepted raw connection as server name.
func serverHandshake(c *conn, name string, secret []byte, version int) error {
	return serverHandshakeAs(c, name, secret, challenge{Version: version})
}

// serverHandshakeAs is serverHandshake with ch's version and what it says
// of the node (its name, host id, nonce and proof are filled in).
func serverHandshakeAs(c *conn, name string, secret []byte, ch challenge) error {
	var h hello
	if err := c.recvJSON(frameHello, &h); err != nil {
		return err
	}
	sn := nonce()
	ch.Name, ch.HostID, ch.Nonce, ch.Proof = name, "raw", sn, proof(secret, "server", h.Nonce, sn, h.Name, name)
	if err := c.sendJSON(frameChallenge, ch); err != nil {
		return err
	}
	var a authMsg
	if err := c.recvJSON(frameAuth, &a); err != nil {
		return err
	}
	if !hmac.Equal(a.Proof, proof(secret, "client", h.Nonce, sn, h.Name, name)) {
		return errors.New("raw server: bad client proof")
	}
	return c.sendJSON(frameOK, reply{})
}

// rawServer listens on loopback and runs handle on every accepted
// connection (in its own goroutine). It returns the address.
func rawServer(t testing.TB, handle func(nc net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, nc)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				handle(nc)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// rawPeer is a peer "b" spoken by hand: rawServer whose every connection
// is authenticated as b and has its first request read before serve gets
// it (nc to break the connection by hand).
func rawPeer(t testing.TB, serve func(nc net.Conn, c *conn, req request)) string {
	t.Helper()
	return rawPeerAs(t, challenge{Version: ProtocolVersion}, serve)
}

// rawPeerAs is rawPeer whose handshake says what ch says of the node
// (serverHandshakeAs).
func rawPeerAs(t testing.TB, ch challenge, serve func(nc net.Conn, c *conn, req request)) string {
	t.Helper()
	return rawServer(t, func(nc net.Conn) {
		defer nc.Close()
		if c, req, ok := rawRequest(nc, ch); ok {
			serve(nc, c, req)
		}
	})
}

// rawRequest authenticates accepted connection nc as peer "b", saying ch
// of the node, and reads its first request; false when either fails.
func rawRequest(nc net.Conn, ch challenge) (*conn, request, bool) {
	c := wrapConn(nc, "raw")
	var req request
	if serverHandshakeAs(c, "b", testSecret, ch) != nil || c.recvJSON(frameRequest, &req) != nil {
		return nil, req, false
	}
	return c, req, true
}

// dataFrame is the payload of a data frame for data, with crc as its
// CRC32C: what a release before XXH3 sends (the raw clients here say
// nothing of XXH3 in their hello).
func dataFrame(index uint32, off int64, data []byte, crc uint32) []byte {
	return sumFrame(chunkHeader{index: index, offset: off, sum: crc, kind: ChecksumCRC32C}, data)
}

// sumFrame is the payload of a data frame of header h and bytes data.
func sumFrame(h chunkHeader, data []byte) []byte {
	b := make([]byte, dataHeaderLen+len(data))
	putChunkHeader(b, h)
	copy(b[dataHeaderLen:], data)
	return b
}

func crcOf(b []byte) uint32 { return ChecksumCRC32C.sum(b) }

// expectError reads frames until an error frame and returns it; it fails on
// a clean OK or on the connection closing without one.
func expectError(t testing.TB, c *conn) wireError {
	t.Helper()
	for {
		typ, p, err := c.recv()
		require.NoError(t, err, "connection ended without an error frame")
		if typ == frameError {
			var we wireError
			require.NoError(t, json.Unmarshal(p, &we))
			return we
		}
		require.NotEqual(t, frameOK, typ, "server answered OK: %s", p)
	}
}

// expectClosed checks that the peer closes the connection (EOF or reset)
// within d.
// requirePutRefused checks a put on c that b refused: an error frame of
// errno, then the connection closed; b as it was (before), clean, the
// destination aborted once and nothing committed. It returns the frame.
func requirePutRefused(t testing.TB, c *conn, b *memLocal, before map[string]string, errno string) wireError {
	t.Helper()
	we := expectError(t, c)
	require.Equal(t, errno, we.Errno, we.Message)
	expectClosed(t, c, 2*time.Second)
	require.Equal(t, before, b.snapshot())
	requireClean(t, b)
	require.Zero(t, b.counts().Commits)
	require.Equal(t, 1, b.counts().Aborts)
	return we
}

func expectClosed(t testing.TB, c *conn, d time.Duration) {
	t.Helper()
	c.c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c.r)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open after %v", d)
	}
}

// ---- copies ----------------------------------------------------------------

func TestPushPullFile(t *testing.T) {
	p := newPair(t, nil)
	data := pattern(1, 1<<20+17) // two chunks, the second short
	p.a.put("/w/a", data)
	p.b.mkdir("/x")
	ctx := context.Background()

	n, err := push(ctx, p.client, p.a, "/w/a", "b", "/x/y")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	requireSameTensor(t, p.a, "/w/a", p.b, "/x/y")

	n, err = pull(ctx, p.client, p.a, "b", "/x/y", "/w/back")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	requireSameTensor(t, p.a, "/w/a", p.a, "/w/back")

	requireClean(t, p.a)
	requireClean(t, p.b)
	ca, cb := p.a.counts(), p.b.counts()
	require.Equal(t, 1, ca.Commits)
	require.Equal(t, 1, cb.Commits)
	require.Zero(t, ca.Aborts+cb.Aborts)
}

func TestPushPullDtypeShape(t *testing.T) {
	p := newPair(t, nil)
	data := pattern(2, 2*3*4*4)
	p.a.put("/f", data)
	p.a.files["/f"].meta = Meta{DType: "F32", Shape: "2,3,4", NBytes: int64(len(data))}
	_, err := push(context.Background(), p.client, p.a, "/f", "b", "/g")
	require.NoError(t, err)
	_, m, _ := p.b.get("/g")
	require.Equal(t, Meta{DType: "F32", Shape: "2,3,4", NBytes: 96}, m)
}

func makeTree(l *memLocal, root string, n int, seed uint64) map[string][]byte {
	r := rand.New(rand.NewPCG(seed, 7))
	want := map[string][]byte{}
	for i := 0; i < n; i++ {
		rel := fmt.Sprintf("d%d/e%d/t%04d", i%10, i%7, i)
		data := pattern(seed+uint64(i), r.IntN(300))
		l.put(root+"/"+rel, data)
		want[rel] = data
	}
	return want
}

func TestPushPullTree1000(t *testing.T) {
	p := newPair(t, nil)
	want := makeTree(p.a, "/tree", 1000, 10)
	p.b.put("/dst/keep", []byte("not in the source")) // left alone
	p.b.put("/dst/d0/e0/t0000", []byte("old"))        // replaced
	ctx := context.Background()

	n, err := push(ctx, p.client, p.a, "/tree", "b", "/dst")
	require.NoError(t, err)
	require.Equal(t, 1000, n)
	for rel, data := range want {
		got, _, ok := p.b.get("/dst/" + rel)
		require.True(t, ok, rel)
		require.True(t, bytes.Equal(data, got), rel)
	}
	keep, _, _ := p.b.get("/dst/keep")
	require.Equal(t, "not in the source", string(keep))

	n, err = pull(ctx, p.client, p.a, "b", "/dst", "/back")
	require.NoError(t, err)
	require.Equal(t, 1001, n)
	for rel, data := range want {
		got, _, ok := p.a.get("/back/" + rel)
		require.True(t, ok, rel)
		require.True(t, bytes.Equal(data, got), rel)
	}
	requireClean(t, p.a)
	requireClean(t, p.b)
	require.Equal(t, 1000, p.a.counts().SrcsOpened)
	require.Equal(t, 1001, p.b.counts().SrcsOpened)
}

func TestLargeTensor64MiB(t *testing.T) {
	data := pattern(3, 64<<20)
	for _, chunk := range []int{0, 4 << 20, 8 << 20 /* clamped to 4 MiB */} {
		t.Run(fmt.Sprintf("chunk=%d", chunk), func(t *testing.T) {
			p := newPair(t, func(c *Config) { c.ChunkSize = chunk })
			p.a.put("/big", data)
			var frames atomic.Int64
			var maxChunk atomic.Int64
			p.b.onWrite = func(i int, off int64, n int) error {
				frames.Add(1)
				if int64(n) > maxChunk.Load() {
					maxChunk.Store(int64(n))
				}
				return nil
			}
			n, err := push(context.Background(), p.client, p.a, "/big", "b", "/big")
			require.NoError(t, err)
			require.Equal(t, 1, n)
			requireSameTensor(t, p.a, "/big", p.b, "/big")
			wantChunk := int64(1 << 20)
			if chunk > 0 {
				// 4 MiB configured (8 clamped to it); 64 MiB over the
				// default two streams takes 16 chunks a stream: 2 MiB
				// (chunkFor).
				wantChunk = 2 << 20
			}
			require.Equal(t, wantChunk, maxChunk.Load())
			require.Equal(t, (64<<20)/wantChunk, frames.Load())

			p.a.files = map[string]*memTensor{}
			n, err = pull(context.Background(), p.client, p.a, "b", "/big", "/again")
			require.NoError(t, err)
			require.Equal(t, 1, n)
			got, _, _ := p.a.get("/again")
			require.True(t, bytes.Equal(data, got))
			requireClean(t, p.a)
			requireClean(t, p.b)
		})
	}
}

func TestOverwrite(t *testing.T) {
	p := newPair(t, nil)
	p.b.put("/x", pattern(4, 100))
	p.a.put("/x", []byte("seven!!"))
	ctx := context.Background()
	_, err := push(ctx, p.client, p.a, "/x", "b", "/x")
	require.NoError(t, err)
	requireSameTensor(t, p.a, "/x", p.b, "/x")

	// bigger over smaller, by pull
	p.b.put("/y", pattern(5, 3<<20))
	_, err = pull(ctx, p.client, p.a, "b", "/y", "/x")
	require.NoError(t, err)
	requireSameTensor(t, p.a, "/x", p.b, "/y")

	// a file onto an existing directory: EISDIR, nothing changes
	p.b.put("/dir/inside", []byte("i"))
	before := p.b.snapshot()
	_, err = push(ctx, p.client, p.a, "/x", "b", "/dir")
	requireErrno(t, err, syscall.EISDIR)
	require.Equal(t, before, p.b.snapshot())
	requireClean(t, p.a)
	requireClean(t, p.b)
}

func TestZeroByteTensors(t *testing.T) {
	p := newPair(t, nil)
	ctx := context.Background()
	p.a.put("/z", nil)
	p.b.put("/z", []byte("old bytes"))
	n, err := push(ctx, p.client, p.a, "/z", "b", "/z")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	got, m, ok := p.b.get("/z")
	require.True(t, ok)
	require.Empty(t, got)
	require.Zero(t, m.NBytes)

	n, err = pull(ctx, p.client, p.a, "b", "/z", "/z2")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	got, _, ok = p.a.get("/z2")
	require.True(t, ok)
	require.Empty(t, got)

	// a tree mixing empty and non-empty tensors
	p.a.put("/t/a", nil)
	p.a.put("/t/b", []byte("b"))
	p.a.put("/t/c/d", nil)
	n, err = push(ctx, p.client, p.a, "/t", "b", "/t")
	require.NoError(t, err)
	require.Equal(t, 3, n)
	for _, rel := range []string{"a", "b", "c/d"} {
		requireSameTensor(t, p.a, "/t/"+rel, p.b, "/t/"+rel)
	}

	// an empty directory: nothing to copy
	p.a.mkdir("/empty")
	n, err = push(ctx, p.client, p.a, "/empty", "b", "/e")
	require.NoError(t, err)
	require.Zero(t, n)
	requireClean(t, p.a)
	requireClean(t, p.b)
}

func TestThreeNodes(t *testing.T) {
	names := []string{"a", "b", "c"}
	locals := map[string]*memLocal{}
	servers := map[string]*Service{}
	for _, n := range names {
		locals[n] = newMemLocal()
		servers[n] = startServer(t, n, locals[n], testSecret, nil)
	}
	clients := map[string]*Service{}
	for _, n := range names {
		peers := map[string]string{}
		for _, m := range names {
			if m != n {
				peers[m] = addrOf(servers[m])
			}
		}
		clients[n] = newClient(t, n, locals[n], testSecret, peers, nil)
	}
	want := makeTree(locals["a"], "/tree", 200, 20)
	locals["c"].put("/blob", pattern(21, 5<<20+3))
	ctx := context.Background()

	var wg sync.WaitGroup
	errs := make(chan error, 4)
	wg.Add(3)
	go func() { // a -> b, then b -> c (relay)
		defer wg.Done()
		if _, err := push(ctx, clients["a"], locals["a"], "/tree", "b", "/from-a"); err != nil {
			errs <- err
			return
		}
		if _, err := push(ctx, clients["b"], locals["b"], "/from-a", "c", "/relayed"); err != nil {
			errs <- err
		}
	}()
	go func() { // a pulls c's blob
		defer wg.Done()
		if _, err := pull(ctx, clients["a"], locals["a"], "c", "/blob", "/blob"); err != nil {
			errs <- err
		}
	}()
	go func() { // c pushes its blob to b
		defer wg.Done()
		if _, err := push(ctx, clients["c"], locals["c"], "/blob", "b", "/blob"); err != nil {
			errs <- err
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for rel, data := range want {
		got, _, ok := locals["c"].get("/relayed/" + rel)
		require.True(t, ok, rel)
		require.True(t, bytes.Equal(data, got), rel)
	}
	requireSameTensor(t, locals["c"], "/blob", locals["a"], "/blob")
	requireSameTensor(t, locals["c"], "/blob", locals["b"], "/blob")
	for _, n := range names {
		requireClean(t, locals[n])
	}
	require.Equal(t, int64(2), clients["a"].Stats().Copies.TCP)
	require.Equal(t, int64(2), servers["b"].Stats().Copies.TCP) // the tree and the blob arrived
}

func TestConcurrentCopiesOneClient(t *testing.T) {
	p := newPair(t, nil)
	for i := 0; i < 8; i++ {
		p.a.put(fmt.Sprintf("/s%d", i), pattern(uint64(30+i), 200<<10+i))
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				_, errs[i] = push(context.Background(), p.client, p.a, fmt.Sprintf("/s%d", i), "b", fmt.Sprintf("/d%d", i))
			} else {
				p.b.put(fmt.Sprintf("/r%d", i), pattern(uint64(30+i), 200<<10+i))
				_, errs[i] = pull(context.Background(), p.client, p.a, "b", fmt.Sprintf("/r%d", i), fmt.Sprintf("/p%d", i))
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err)
		if i%2 == 0 {
			requireSameTensor(t, p.a, fmt.Sprintf("/s%d", i), p.b, fmt.Sprintf("/d%d", i))
		} else {
			requireSameTensor(t, p.a, fmt.Sprintf("/p%d", i), p.b, fmt.Sprintf("/r%d", i))
		}
	}
	require.Equal(t, int64(8), p.client.Stats().Copies.TCP)
	require.Eventually(t, func() bool { return p.srv.Stats().Copies.TCP == 8 }, 5*time.Second, 5*time.Millisecond)
	requireClean(t, p.a)
	requireClean(t, p.b)
}

// ---- remote errors ---------------------------------------------------------

func TestRemoteErrnos(t *testing.T) {
	p := newPair(t, nil)
	p.a.put("/f", []byte("f"))
	p.a.put("/d/x", []byte("x"))
	p.b.put("/file", []byte("file"))
	ctx := context.Background()

	_, err := pull(ctx, p.client, p.a, "b", "/missing", "/m")
	requireErrno(t, err, syscall.ENOENT, "missing source")
	_, err = push(ctx, p.client, p.a, "/f", "b", "/no/such/parent")
	requireErrno(t, err, syscall.ENOENT, "missing destination parent")
	_, err = push(ctx, p.client, p.a, "/f", "b", "/file/under")
	requireErrno(t, err, syscall.ENOTDIR)
	_, err = push(ctx, p.client, p.a, "/d", "b", "/file")
	requireErrno(t, err, syscall.ENOTDIR)
	_, err = push(ctx, p.client, p.a, "/f", "b", "/")
	requireErrno(t, err, syscall.EISDIR)

	// the local side refuses in prepare: Receive returns its error
	_, err = p.client.Receive(ctx, Pull{Peer: "b", Path: "/file", Dst: "/x"}, func(bool, []Meta) (Dest, error) {
		return nil, &Error{Errno: syscall.ENOSPC, Msg: "full"}
	})
	requireErrno(t, err, syscall.ENOSPC)
	requireClean(t, p.a)
	requireClean(t, p.b)
	require.Zero(t, p.b.counts().Commits)
}

func TestUnknownPeer(t *testing.T) {
	p := newPair(t, nil)
	p.a.put("/f", []byte("f"))
	_, err := push(context.Background(), p.client, p.a, "/f", "nope", "/f")
	requireErrno(t, err, syscall.ENOENT)
	_, err = pull(context.Background(), p.client, p.a, "nope", "/f", "/g")
	requireErrno(t, err, syscall.ENOENT)
	requireClean(t, p.a)
	st := p.client.Stats()
	require.Zero(t, st.Copies.TCP)
	require.Len(t, st.Transfers.Recent, 2)
	for _, r := range st.Transfers.Recent {
		require.Contains(t, r.Error, "nope")
	}
}

// ---- authentication --------------------------------------------------------

func TestWrongSecret(t *testing.T) {
	b := newMemLocal()
	b.put("/x", []byte("server data"))
	srv := startServer(t, "b", b, testSecret, nil)
	a := newMemLocal()
	a.put("/x", []byte("client data"))
	cl := newClient(t, "a", a, otherSecret, map[string]string{"b": addrOf(srv)}, nil)
	before, beforeA := b.snapshot(), a.snapshot()

	_, err := push(context.Background(), cl, a, "/x", "b", "/x")
	requireErrno(t, err, syscall.EACCES, "push")
	_, err = pull(context.Background(), cl, a, "b", "/x", "/x")
	requireErrno(t, err, syscall.EACCES, "pull")

	require.Equal(t, before, b.snapshot())
	require.Equal(t, beforeA, a.snapshot())
	gets, puts := b.seen()
	require.Empty(t, gets, "server touched its Local for an unauthenticated peer")
	require.Empty(t, puts, "server touched its Local for an unauthenticated peer")
	requireClean(t, a)
	requireClean(t, b)
	require.Zero(t, srv.Stats().Copies.TCP)
	require.Zero(t, cl.Stats().Copies.TCP)

	// the server side refuses too: a client that ignores the server's proof
	// and sends a wrong one of its own gets EACCES and the connection drops.
	c := rawClient(t, addrOf(srv))
	err = clientHandshake(c, "intruder", otherSecret)
	requireErrno(t, err, syscall.EACCES)
	require.Contains(t, err.Error(), "hold different shared secrets")
	expectClosed(t, c, 2*time.Second)

	// and a proof of the right length, all zeros
	c = rawClient(t, addrOf(srv))
	require.NoError(t, c.sendJSON(frameHello, hello{Version: ProtocolVersion, Name: "z", Nonce: nonce()}))
	require.NoError(t, c.recvJSON(frameChallenge, &challenge{}))
	require.NoError(t, c.sendJSON(frameAuth, authMsg{Proof: make([]byte, 32)}))
	we := expectError(t, c)
	require.Equal(t, "EACCES", we.Errno)

	// no proof at all, then a request anyway
	c = rawClient(t, addrOf(srv))
	require.NoError(t, c.sendJSON(frameHello, hello{Version: ProtocolVersion, Name: "z", Nonce: nonce()}))
	require.NoError(t, c.recvJSON(frameChallenge, &challenge{}))
	require.NoError(t, c.sendJSON(frameRequest, request{Op: "get", Path: "/x"}))
	expectClosed(t, c, 2*time.Second)
	gets, puts = b.seen()
	require.Empty(t, gets)
	require.Empty(t, puts)
}

func TestSecretOnOneSide(t *testing.T) {
	for _, tc := range []struct {
		name           string
		server, client []byte
	}{
		{"server only", testSecret, nil},
		{"client only", nil, testSecret},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newMemLocal()
			b.put("/x", []byte("x"))
			srv := startServer(t, "b", b, tc.server, nil)
			a := newMemLocal()
			a.put("/x", []byte("y"))
			cl := newClient(t, "a", a, tc.client, map[string]string{"b": addrOf(srv)}, nil)
			_, err := push(context.Background(), cl, a, "/x", "b", "/x")
			requireErrno(t, err, syscall.EACCES)
			_, err = pull(context.Background(), cl, a, "b", "/x", "/x")
			requireErrno(t, err, syscall.EACCES)
			d, _, _ := b.get("/x")
			require.Equal(t, "x", string(d))
			d, _, _ = a.get("/x")
			require.Equal(t, "y", string(d))
			gets, puts := b.seen()
			require.Empty(t, gets)
			require.Empty(t, puts)
		})
	}

	// neither side: allowed on loopback
	b := newMemLocal()
	b.put("/x", []byte("x"))
	srv := startServer(t, "b", b, nil, nil)
	a := newMemLocal()
	cl := newClient(t, "a", a, nil, map[string]string{"b": addrOf(srv)}, nil)
	_, err := pull(context.Background(), cl, a, "b", "/x", "/x")
	require.NoError(t, err)
}

func TestConfigErrors(t *testing.T) {
	bad := []Config{
		{Secret: []byte("fifteen-bytes!!")},
		{Secret: []byte{}},
		{Listen: "127.0.0.1:0", Secret: []byte("short")},
		{Listen: "0.0.0.0:0"},
		{Listen: ":0"},
		{Listen: "[::]:0"},
		{Listen: "10.1.2.3:7000"},
		{Listen: "example.com:7000"},
		{Listen: "no-port"},
	}
	for _, cfg := range bad {
		s, err := New(cfg, newMemLocal())
		require.ErrorIs(t, err, ErrConfig, "%+v", cfg)
		require.Nil(t, s)
	}
	good := []Config{
		{},
		{Secret: []byte("sixteen-bytes!!!")},
		{Listen: "127.0.0.1:0"},
		{Listen: "localhost:0"},
		{Listen: "[::1]:0"},
		{Listen: "0.0.0.0:0", Secret: testSecret},
		{Peers: map[string]string{"x": "10.0.0.1:1"}}, // a client may dial anywhere
	}
	for _, cfg := range good {
		s, err := New(cfg, newMemLocal())
		require.NoError(t, err, "%+v", cfg)
		require.NotNil(t, s)
	}
}

func TestVersionMismatch(t *testing.T) {
	srv := startServer(t, "b", newMemLocal(), testSecret, nil)
	nc, err := net.Dial("tcp", addrOf(srv))
	require.NoError(t, err)
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	require.NoError(t, writeFrame(nc, frameHello, marshal(hello{Version: 99, Name: "future", Nonce: nonce()})))
	typ, p, err := readFrame(nc, nil, MaxFrame)
	require.NoError(t, err)
	require.Equal(t, frameError, typ, "payload %s", p)
	var we wireError
	require.NoError(t, json.Unmarshal(p, &we))
	require.Equal(t, "EPROTO", we.Errno)
	require.Contains(t, we.Message, "99")
	require.Contains(t, we.Message, fmt.Sprintf("speaks %d", ProtocolVersion))
	require.Contains(t, we.Message, "future")
	_, _, err = readFrame(nc, nil, MaxFrame)
	require.ErrorIs(t, err, io.EOF, "the server keeps the connection")

	// the Service as a client: a version-mismatch error frame is EPROTO
	cl := newClient(t, "a", newMemLocal(), testSecret, map[string]string{"b": addrOf(srv)}, nil)
	_, err = cl.Receive(context.Background(), Pull{Peer: "b", Path: "/x", Dst: "/x"}, nil)
	requireErrno(t, err, syscall.ENOENT) // sanity: a v1 client is served
}

// The client side must refuse a server that answers with another protocol
// version too ("peers with another version are refused at the handshake
// with both versions named").
func TestVersionMismatchClientSide(t *testing.T) {
	addr := rawServer(t, func(nc net.Conn) {
		c := wrapConn(nc, "raw")
		defer nc.Close()
		if serverHandshake(c, "b", testSecret, 99) != nil {
			return
		}
		c.recv()
		c.sendError(&Error{Errno: syscall.EIO, Msg: "the raw server got a request after a version-99 challenge"})
	})
	cl := newClient(t, "a", newMemLocal(), testSecret, map[string]string{"b": addr}, nil)
	_, err := cl.Receive(context.Background(), Pull{Peer: "b", Path: "/x", Dst: "/x"}, func(bool, []Meta) (Dest, error) { return nil, errors.New("unreachable") })
	requireErrno(t, err, syscall.EPROTO)
	require.Contains(t, err.Error(), "99")
}

// ---- peer down -------------------------------------------------------------

func closedPort(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestConnectionRefused(t *testing.T) {
	a := newMemLocal()
	a.put("/f", []byte("f"))
	cl := newClient(t, "a", a, testSecret, map[string]string{"down": closedPort(t)}, nil)
	_, err := push(context.Background(), cl, a, "/f", "down", "/f")
	requireErrno(t, err, syscall.ECONNREFUSED)
	_, err = pull(context.Background(), cl, a, "down", "/f", "/g")
	requireErrno(t, err, syscall.ECONNREFUSED)
	requireClean(t, a)
	require.Zero(t, cl.Stats().Transfers.Active)
}

func TestSilentPeerTimesOut(t *testing.T) {
	const timeout = 500 * time.Millisecond
	// a listener that accepts and never says a word
	silent := rawServer(t, func(nc net.Conn) { io.Copy(io.Discard, nc) })
	// a peer that authenticates, then never answers the request
	mute := rawServer(t, func(nc net.Conn) {
		c := wrapConn(nc, "raw")
		if serverHandshake(c, "mute", testSecret, ProtocolVersion) == nil {
			io.Copy(io.Discard, nc)
		}
	})
	// a peer that takes the put, reads everything, never commits (the
	// 40-byte put is eager: its data follows the request with no go-ahead)
	stuck := rawServer(t, func(nc net.Conn) {
		c := wrapConn(nc, "raw")
		if serverHandshake(c, "stuck", testSecret, ProtocolVersion) != nil {
			return
		}
		if _, _, err := c.recv(); err != nil {
			return
		}
		io.Copy(io.Discard, nc)
	})
	a := newMemLocal()
	a.put("/f", pattern(40, 1000))
	cl := newClient(t, "a", a, testSecret, map[string]string{"silent": silent, "mute": mute, "stuck": stuck}, func(c *Config) { c.Timeout = timeout })
	for _, peer := range []string{"silent", "mute", "stuck"} {
		start := time.Now()
		_, err := push(context.Background(), cl, a, "/f", peer, "/f")
		el := time.Since(start)
		requireErrno(t, err, syscall.ETIMEDOUT, peer)
		require.Less(t, el, 3*timeout, "%s: push took %v with Timeout %v", peer, el, timeout)
		require.GreaterOrEqual(t, el, timeout*9/10, peer)
		if peer == "stuck" {
			continue // a get is not accepted by it
		}
		start = time.Now()
		_, err = pull(context.Background(), cl, a, peer, "/f", "/g")
		el = time.Since(start)
		requireErrno(t, err, syscall.ETIMEDOUT, peer)
		require.Less(t, el, 3*timeout, "%s: pull took %v", peer, el)
	}
	requireClean(t, a)
	st := cl.Stats()
	require.Zero(t, st.Transfers.Active)
	require.Zero(t, st.Copies.TCP)
}

// genSource is a large source whose bytes are generated, not stored.
type genSource struct {
	meta   Meta
	reads  atomic.Int64
	closes atomic.Int64
	tmpl   []byte
}

func newGenSource(rel string, n int64) *genSource {
	return &genSource{meta: Meta{Rel: rel, DType: "U8", Shape: fmt.Sprint(n), NBytes: n}, tmpl: pattern(99, 1<<20)}
}

func (g *genSource) Meta() Meta { return g.meta }
func (g *genSource) ReadAt(p []byte, off int64) (int, error) {
	g.reads.Add(1)
	if g.closes.Load() > 0 {
		return 0, syscall.EBADF
	}
	for n := 0; n < len(p); {
		n += copy(p[n:], g.tmpl[(off+int64(n))%int64(len(g.tmpl)):])
	}
	return len(p), nil
}
func (g *genSource) Close() { g.closes.Add(1) }

func TestDestinationDiesMidStream(t *testing.T) {
	const timeout = 2 * time.Second
	t.Run("service closed", func(t *testing.T) {
		b := newMemLocal()
		b.sink = true
		reached := make(chan struct{})
		var once sync.Once
		b.onWrite = func(i int, off int64, n int) error {
			if off >= 8<<20 {
				once.Do(func() { close(reached) })
			}
			return nil
		}
		srv := startServer(t, "b", b, testSecret, func(c *Config) { c.Timeout = timeout })
		cl := newClient(t, "a", newMemLocal(), testSecret, map[string]string{"b": addrOf(srv)}, func(c *Config) { c.Timeout = timeout })
		src := newGenSource("", 256<<20)
		closedAt := make(chan time.Time, 1)
		go func() {
			<-reached
			closedAt <- time.Now()
			srv.Close()
		}()
		_, err := cl.Send(context.Background(), "b", "/big", []Source{src}, false, "/big")
		returned := time.Now()
		require.Error(t, err)
		require.Less(t, returned.Sub(<-closedAt), timeout+time.Second, "Send took too long after the peer died")
		readsAtReturn := src.reads.Load()
		src.Close() // the caller's close, as push does
		time.Sleep(50 * time.Millisecond)
		require.Equal(t, readsAtReturn, src.reads.Load(), "the source is still being read after Send returned")
		require.Equal(t, int64(1), src.closes.Load(), "Send closed the caller's source itself")
		c := b.counts()
		require.Zero(t, c.Commits)
		require.Equal(t, 1, c.Aborts)
		require.Zero(t, c.OpenDests)
		_, _, ok := b.get("/big")
		require.False(t, ok)
		require.Zero(t, cl.Stats().Transfers.Active)
		require.NotEmpty(t, cl.Stats().Transfers.Recent[0].Error)
		// Send documents EIO for a broken stream (ETIMEDOUT if it went silent)
		require.Truef(t, errors.Is(err, syscall.EIO) || errors.Is(err, syscall.ETIMEDOUT),
			"a peer that died mid-stream: want EIO or ETIMEDOUT, got %q (%T, errno %v)", err, err, Errno(err))
	})

	t.Run("raw server hangs up", func(t *testing.T) {
		addr := rawPeer(t, func(_ net.Conn, c *conn, req request) {
			if !req.Early { // an early put's data comes with no go-ahead
				c.sendJSON(frameOK, reply{})
			}
			for i := 0; i < 3; i++ {
				if _, _, err := c.recv(); err != nil {
					return
				}
			}
		})
		cl := newClient(t, "a", newMemLocal(), testSecret, map[string]string{"b": addr}, func(c *Config) { c.Timeout = timeout })
		src := newGenSource("", 256<<20)
		start := time.Now()
		_, err := cl.Send(context.Background(), "b", "/big", []Source{src}, false, "/big")
		require.Error(t, err)
		require.Less(t, time.Since(start), timeout+time.Second)
		src.Close()
		require.Equal(t, int64(1), src.closes.Load())
		require.Zero(t, cl.Stats().Transfers.Active)
		require.NotEmpty(t, cl.Stats().Transfers.Recent[0].Error)
		require.Truef(t, errors.Is(err, syscall.EIO) || errors.Is(err, syscall.ETIMEDOUT),
			"a peer that hung up mid-stream: want EIO or ETIMEDOUT, got %q (%T, errno %v)", err, err, Errno(err))
	})

	t.Run("source dies mid pull", func(t *testing.T) {
		p := newPair(t, func(c *Config) { c.Timeout = timeout })
		p.b.put("/big", pattern(41, 16<<20))
		p.a.put("/big", []byte("old"))
		before := p.a.snapshot()
		var once sync.Once
		p.b.onRead = func(rel string, off int64) error {
			if off >= 4<<20 {
				once.Do(func() {
					go p.srv.Close()
					time.Sleep(timeout / 4)
				})
			}
			return nil
		}
		start := time.Now()
		_, err := pull(context.Background(), p.client, p.a, "b", "/big", "/big")
		require.Error(t, err)
		require.Less(t, time.Since(start), timeout+time.Second)
		require.Equal(t, before, p.a.snapshot())
		requireClean(t, p.a)
		requireClean(t, p.b)
		require.Equal(t, 1, p.a.counts().Aborts)
	})
}

// A destination that fails while writing (ENOSPC part-way through a large
// put) must report that errno to the sender, not a broken pipe.
func TestSendReportsDestinationError(t *testing.T) {
	p := newPair(t, func(c *Config) { c.Timeout = 2 * time.Second })
	p.b.sink = true
	p.b.onWrite = func(i int, off int64, n int) error {
		if off >= 8<<20 {
			return &Error{Errno: syscall.ENOSPC, Msg: "device full"}
		}
		return nil
	}
	src := newGenSource("", 64<<20)
	_, err := p.client.Send(context.Background(), "b", "/big", []Source{src}, false, "/big")
	src.Close()
	c := p.b.counts()
	require.Zero(t, c.Commits)
	require.Equal(t, 1, c.Aborts)
	requireErrno(t, err, syscall.ENOSPC, "the destination's errno is lost")
}

func TestSourceReadErrorOnPull(t *testing.T) {
	p := newPair(t, nil)
	p.b.put("/big", pattern(42, 6<<20))
	p.b.onRead = func(rel string, off int64) error {
		if off >= 3<<20 {
			return syscall.EIO
		}
		return nil
	}
	p.a.put("/big", []byte("old"))
	before := p.a.snapshot()
	_, err := pull(context.Background(), p.client, p.a, "b", "/big", "/big")
	requireErrno(t, err, syscall.EIO)
	require.Equal(t, before, p.a.snapshot())
	requireClean(t, p.a)
	requireClean(t, p.b)
	require.Equal(t, 1, p.a.counts().Aborts)
}

func TestCancelMidStream(t *testing.T) {
	p := newPair(t, nil)
	p.b.sink = true
	ctx, cancel := context.WithCancel(context.Background())
	var once sync.Once
	p.b.onWrite = func(i int, off int64, n int) error {
		if off >= 4<<20 {
			once.Do(cancel)
		}
		return nil
	}
	src := newGenSource("", 256<<20)
	start := time.Now()
	_, err := p.client.Send(ctx, "b", "/big", []Source{src}, false, "/big")
	require.Error(t, err)
	require.Less(t, time.Since(start), 3*time.Second)
	src.Close()
	requireClean(t, p.b)
	require.Zero(t, p.b.counts().Commits)
	require.Zero(t, p.client.Stats().Transfers.Active)
}

// ---- hostile clients -------------------------------------------------------

// authed returns a raw client authenticated to srv.
func authed(t testing.TB, srv *Service) *conn {
	c := rawClient(t, addrOf(srv))
	require.NoError(t, clientHandshake(c, "raw", testSecret))
	return c
}

// authedLocal is authed on srv's abstract unix socket, the way a peer of
// its host connects.
func authedLocal(t testing.TB, srv *Service) *conn {
	t.Helper()
	require.NotEmpty(t, srv.localName, "the server has a unix socket")
	nc, err := net.Dial("unix", srv.localName)
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	c := wrapConn(nc, "server")
	require.NoError(t, clientHandshake(c, "raw", testSecret))
	return c
}

func putRequest(t testing.TB, c *conn, path string, metas ...Meta) {
	t.Helper()
	require.NoError(t, c.sendJSON(frameRequest, request{Op: "put", Path: path, Tensors: metas}))
	var total int64
	for _, m := range metas {
		total += m.NBytes
	}
	if !eagerPut(total, 0, 0) { // a small put's data follows at once
		require.NoError(t, c.recvJSON(frameOK, nil))
	}
}

func TestCorruptChunk(t *testing.T) {
	data := []byte("newbytes")
	// Into a destination written chunk by chunk, and into one that takes
	// small chunks as batches (BatchWriter: GPU memory).
	for _, batch := range []bool{false, true} {
		b := newMemLocal()
		b.batch = batch
		b.put("/x", []byte("old contents"))
		srv := startServer(t, "b", b, testSecret, nil)
		before := b.snapshot()

		c := authed(t, srv)
		putRequest(t, c, "/x", Meta{DType: "U8", Shape: "8", NBytes: 8})
		require.NoError(t, c.send(frameData, dataFrame(0, 0, data, crcOf(data)^1)))
		require.NoError(t, c.sendJSON(frameDone, doneMsg{Chunks: 1}))
		we := requirePutRefused(t, c, b, before, "EIO")
		require.Contains(t, we.Message, "checksum mismatch (crc32c)", "batch %v", batch)
		st := srv.Stats()
		require.Zero(t, st.Copies.TCP)
		require.Len(t, st.Transfers.Recent, 1)
		require.Contains(t, st.Transfers.Recent[0].Error, "checksum mismatch (crc32c)")
	}

	// a corrupted chunk on a pull: the client aborts and keeps its tensor
	addr := rawPeer(t, func(nc net.Conn, c *conn, _ request) {
		c.sendJSON(frameOK, reply{Tensors: []Meta{{DType: "U8", Shape: "8", NBytes: 8}}})
		c.send(frameData, dataFrame(0, 0, data, crcOf(data)+1))
		c.sendJSON(frameDone, doneMsg{Chunks: 1})
		io.Copy(io.Discard, nc)
	})
	a := newMemLocal()
	a.put("/x", []byte("mine"))
	beforeA := a.snapshot()
	cl := newClient(t, "a", a, testSecret, map[string]string{"b": addr}, nil)
	_, err := pull(context.Background(), cl, a, "b", "/x", "/x")
	requireErrno(t, err, syscall.EIO)
	require.Equal(t, beforeA, a.snapshot())
	requireClean(t, a)
	require.Equal(t, 1, a.counts().Aborts)
	require.Zero(t, a.counts().Commits)
}

func TestChunkOutOfRange(t *testing.T) {
	data := []byte("12345678")
	cases := []struct {
		name  string
		frame []byte
		want  string
	}{
		{"index out of range", dataFrame(1, 0, data, crcOf(data)), "EPROTO"},
		{"index max", dataFrame(math.MaxUint32, 0, data, crcOf(data)), "EPROTO"},
		{"past the end", dataFrame(0, 4, data, crcOf(data)), "EPROTO"},
		{"far past the end", dataFrame(0, 1<<40, data[:1], crcOf(data[:1])), "EPROTO"},
		{"negative offset", dataFrame(0, -8, data, crcOf(data)), "EPROTO"},
		{"short header", []byte{0, 0, 0}, "EPROTO"},
		// offset+len overflows int64: must not slip past the bounds check
		{"offset overflow", dataFrame(0, math.MaxInt64, data[:1], crcOf(data[:1])), "EPROTO"},
		{"offset overflow 8", dataFrame(0, math.MaxInt64-3, data, crcOf(data)), "EPROTO"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newMemLocal()
			b.put("/x", []byte("old"))
			srv := startServer(t, "b", b, testSecret, nil)
			before := b.snapshot()
			c := authed(t, srv)
			putRequest(t, c, "/x", Meta{DType: "U8", Shape: "8", NBytes: 8})
			require.NoError(t, c.send(frameData, tc.frame))
			require.NoError(t, c.sendJSON(frameDone, doneMsg{Chunks: 1}))
			requirePutRefused(t, c, b, before, tc.want)
		})
	}
}

// Every byte must arrive exactly once: a chunk sent twice in place of
// another must not commit a tensor with a hole.
func TestDuplicateChunkNotCommitted(t *testing.T) {
	b := newMemLocal()
	b.put("/x", []byte("old"))
	srv := startServer(t, "b", b, testSecret, nil)
	before := b.snapshot()
	c := authed(t, srv)
	putRequest(t, c, "/x", Meta{DType: "U8", Shape: "8", NBytes: 8})
	half := []byte("abcd")
	require.NoError(t, c.send(frameData, dataFrame(0, 0, half, crcOf(half))))
	require.NoError(t, c.send(frameData, dataFrame(0, 0, half, crcOf(half))))
	require.NoError(t, c.sendJSON(frameDone, doneMsg{Chunks: 2}))
	typ, p, err := c.recv()
	require.NoError(t, err)
	require.Equal(t, frameError, typ, "the server committed %q after [0,4) twice and [4,8) never: %s", func() string { d, _, _ := b.get("/x"); return string(d) }(), p)
	require.Equal(t, before, b.snapshot())
	require.Zero(t, b.counts().Commits)
}

func TestMissingBytesNotCommitted(t *testing.T) {
	b := newMemLocal()
	b.put("/x", []byte("old"))
	srv := startServer(t, "b", b, testSecret, nil)
	before := b.snapshot()
	c := authed(t, srv)
	putRequest(t, c, "/x", Meta{DType: "U8", Shape: "8", NBytes: 8})
	half := []byte("abcd")
	require.NoError(t, c.send(frameData, dataFrame(0, 4, half, crcOf(half))))
	require.NoError(t, c.sendJSON(frameDone, doneMsg{Chunks: 1}))
	we := expectError(t, c)
	require.Equal(t, "EPROTO", we.Errno, "a chunk past a hole is out of order")
	require.Equal(t, before, b.snapshot())
	requireClean(t, b)
	require.Equal(t, 1, b.counts().Aborts)
}

func TestBadRequests(t *testing.T) {
	b := newMemLocal()
	b.put("/x", []byte("old"))
	srv := startServer(t, "b", b, testSecret, nil)
	before := b.snapshot()
	m := Meta{DType: "U8", Shape: "1", NBytes: 1}
	for _, tc := range []struct {
		name string
		req  request
		want string
	}{
		{"unknown op", request{Op: "delete", Path: "/x"}, "EINVAL"},
		{"file with two tensors", request{Op: "put", Path: "/x", Tensors: []Meta{m, m}}, "EPROTO"},
		{"file with no tensor", request{Op: "put", Path: "/x"}, "EPROTO"},
		{"file tensor with a rel", request{Op: "put", Path: "/x", Tensors: []Meta{{Rel: "a", NBytes: 1}}}, "EPROTO"},
		{"negative size", request{Op: "put", Path: "/x", Tensors: []Meta{{NBytes: -1}}}, "EPROTO"},
		{"dir rel with ..", request{Op: "put", Path: "/d", Dir: true, Tensors: []Meta{{Rel: "../escape", NBytes: 1}}}, "EPROTO"},
		{"dir rel absolute", request{Op: "put", Path: "/d", Dir: true, Tensors: []Meta{{Rel: "/abs", NBytes: 1}}}, "EPROTO"},
		{"dir rel empty", request{Op: "put", Path: "/d", Dir: true, Tensors: []Meta{{Rel: "", NBytes: 1}}}, "EPROTO"},
		{"dir rel twice", request{Op: "put", Path: "/d", Dir: true, Tensors: []Meta{{Rel: "a", NBytes: 1}, {Rel: "a", NBytes: 1}}}, "EPROTO"},
		{"too big for the Local", request{Op: "put", Path: "/x", Tensors: []Meta{{NBytes: 1 << 50}}}, "ENOSPC"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := authed(t, srv)
			require.NoError(t, c.sendJSON(frameRequest, tc.req))
			we := expectError(t, c)
			require.Equal(t, tc.want, we.Errno, we.Message)
		})
	}
	require.Equal(t, before, b.snapshot())
	requireClean(t, b)
	require.Zero(t, b.counts().Commits)

	// garbage after the handshake: the connection is dropped
	c := authed(t, srv)
	require.NoError(t, c.send(frameData, []byte("not a request")))
	require.NoError(t, c.flush())
	expectClosed(t, c, 2*time.Second)
	c = authed(t, srv)
	_, err := c.c.Write([]byte{0xff, 0xff, 0xff, 0xff, 1})
	require.NoError(t, err)
	expectClosed(t, c, 2*time.Second)
}

// The server must check request paths itself (Local assumes "already
// checked (absolute, no ..)"): a peer can touch only paths inside the mount.
func TestServerChecksRequestPaths(t *testing.T) {
	b := newMemLocal()
	b.put("/x", []byte("old"))
	srv := startServer(t, "b", b, testSecret, nil)
	m := Meta{DType: "U8", Shape: "1", NBytes: 1}
	for _, path := range []string{"/../etc/passwd", "../x", "x", "/a/../x", "/./x", "//x", "/a\x00b", ""} {
		for _, op := range []string{"put", "get"} {
			t.Run(fmt.Sprintf("%s %q", op, path), func(t *testing.T) {
				c := authed(t, srv)
				req := request{Op: op, Path: path}
				if op == "put" {
					req.Tensors = []Meta{m}
				}
				require.NoError(t, c.sendJSON(frameRequest, req))
				typ, p, err := c.recv()
				require.NoError(t, err)
				require.Equal(t, frameError, typ, "the server accepted %s %q: %s", op, path, p)
				var we wireError
				require.NoError(t, json.Unmarshal(p, &we))
				require.Equal(t, "EINVAL", we.Errno)
			})
		}
	}
	gets, puts := b.seen()
	require.Empty(t, gets, "unchecked paths reached Local.Get")
	require.Empty(t, puts, "unchecked paths reached Local.Put")

	// and through the API: Send/Receive pass remotePath through unchecked
	a := newMemLocal()
	a.put("/f", []byte("f"))
	cl := newClient(t, "a", a, testSecret, map[string]string{"b": addrOf(srv)}, nil)
	_, err := push(context.Background(), cl, a, "/f", "b", "/a/../../x")
	requireErrno(t, err, syscall.EINVAL)
}

// An error frame naming an errno the receiver does not know must still
// surface as a failure with a non-zero errno (EIO), never Errno 0.
func TestUnknownWireErrno(t *testing.T) {
	addr := rawServer(t, func(nc net.Conn) {
		c := wrapConn(nc, "raw")
		defer nc.Close()
		if _, _, err := c.recv(); err != nil {
			return
		}
		c.sendJSON(frameError, wireError{Errno: "EFUTURE", Message: "something new"})
	})
	a := newMemLocal()
	a.put("/f", []byte("f"))
	cl := newClient(t, "a", a, testSecret, map[string]string{"b": addr}, nil)
	_, err := push(context.Background(), cl, a, "/f", "b", "/f")
	require.Error(t, err)
	require.Equal(t, syscall.EIO, Errno(err))
	var te *Error
	require.True(t, errors.As(err, &te))
	require.NotZero(t, te.Errno, "an *Error with Errno 0 reads as success to a caller that returns te.Errno")
}

// ---- paths -----------------------------------------------------------------

func TestParsePeerPath(t *testing.T) {
	long := strings.Repeat("n", 256)
	ok255 := strings.Repeat("n", 255)
	for _, tc := range []struct {
		in         string
		peer, path string
		errno      syscall.Errno
	}{
		{"nodeB:/kv/layer0", "nodeB", "/kv/layer0", 0},
		{"nodeB:/", "nodeB", "/", 0},
		{"/local/path", "", "/local/path", 0},
		{"/local/path/", "", "/local/path", 0},
		{"/a:b", "", "/a:b", 0},
		{"n:/d/" + ok255, "n", "/d/" + ok255, 0},
		{"nodeB:/kv\n", "nodeB", "/kv", 0},
		{":/x", "", "", syscall.EINVAL},
		{"n:", "", "", syscall.EINVAL},
		{"n:rel", "", "", syscall.EINVAL},
		{"rel/path", "", "", syscall.EINVAL},
		{"", "", "", syscall.EINVAL},
		{"n:/a/../b", "", "", syscall.EINVAL},
		{"n:/..", "", "", syscall.EINVAL},
		{"n:/.", "", "", syscall.EINVAL},
		{"n:/a/./b", "", "", syscall.EINVAL},
		{"n://", "", "", syscall.EINVAL},
		{"n://a", "", "", syscall.EINVAL},
		{"n:/a//b", "", "", syscall.EINVAL},
		{"n:/a//", "", "", syscall.EINVAL},
		{"n:/a\x00b", "", "", syscall.EINVAL},
		{"n:/" + long, "", "", syscall.ENAMETOOLONG},
		{"/d/" + long + "/x", "", "", syscall.ENAMETOOLONG},
	} {
		peer, path, err := ParsePeerPath(tc.in)
		if tc.errno == 0 {
			require.NoError(t, err, "%q", tc.in)
			require.Equal(t, tc.peer, peer, "%q", tc.in)
			require.Equal(t, tc.path, path, "%q", tc.in)
			continue
		}
		requireErrno(t, err, tc.errno, "%q", tc.in)
		var te *Error
		require.True(t, errors.As(err, &te), "%q: want *Error, got %T", tc.in, err)
	}
}

func TestCleanPath(t *testing.T) {
	for _, in := range []string{"", ".", "..", "a", "a/b", "/..", "/.", "/a/..", "/a/.", "//", "///", "/a//b", "/\x00", "/a/b\x00"} {
		_, err := CleanPath(in)
		requireErrno(t, err, syscall.EINVAL, "%q", in)
	}
	_, err := CleanPath("/" + strings.Repeat("x", 256))
	requireErrno(t, err, syscall.ENAMETOOLONG)
	for in, want := range map[string]string{"/": "/", "/a": "/a", "/a/": "/a", "/a/b": "/a/b", "/..a/b..": "/..a/b..", "/" + strings.Repeat("x", 255): "/" + strings.Repeat("x", 255)} {
		got, err := CleanPath(in)
		require.NoError(t, err, "%q", in)
		require.Equal(t, want, got)
	}
	for _, in := range []string{"", "/a", "a/", "../a", "a/.", "a//b", "a\x00"} {
		_, err := CleanRel(in)
		requireErrno(t, err, syscall.EINVAL, "%q", in)
	}
}

// ---- stats -----------------------------------------------------------------

// timing checks a finished record's times (took_us set; phase_us only on
// the receiving side, within took_us) and returns it without them.
func timing(t *testing.T, r RecordReport, received bool) RecordReport {
	t.Helper()
	require.Positive(t, r.TookUS, "a finished transfer says how long it took")
	if !received {
		require.Nil(t, r.PhaseUS, "phases are the receiver's")
	} else {
		require.NotNil(t, r.PhaseUS, "the receiver times its phases")
		ph := *r.PhaseUS
		require.Positive(t, ph.Data)
		require.LessOrEqual(t, ph.Prepare+ph.Data+ph.Commit, r.TookUS)
	}
	r.TookUS, r.PhaseUS = 0, nil
	return r
}

func TestStats(t *testing.T) {
	var nilSvc *Service
	st := nilSvc.Stats()
	require.Zero(t, st.Copies.TCP)
	require.NotNil(t, st.Transfers.Recent)
	require.NotNil(t, st.Peers)

	p := newPair(t, nil)
	p.a.put("/f", pattern(50, 3<<20))
	p.b.mkdir("/d")
	ctx := context.Background()

	// active while a copy runs, on both sides
	gate := make(chan struct{})
	entered := make(chan struct{})
	var once sync.Once
	p.b.onWrite = func(i int, off int64, n int) error {
		once.Do(func() { close(entered); <-gate })
		return nil
	}
	done := make(chan error, 1)
	go func() {
		_, err := push(ctx, p.client, p.a, "/f", "b", "/d/f")
		done <- err
	}()
	<-entered
	require.Equal(t, int64(1), p.client.Stats().Transfers.Active)
	require.Equal(t, int64(1), p.srv.Stats().Transfers.Active)
	close(gate)
	require.NoError(t, <-done)
	p.b.onWrite = nil

	cs := p.client.Stats()
	require.Equal(t, int64(1), cs.Copies.TCP)
	require.Zero(t, cs.Copies.Local+cs.Copies.IPC)
	require.Zero(t, cs.Transfers.Active)
	// A --peer a handshake reached: what it said, and when.
	pb := cs.Peers["b"]
	reached, perr := time.Parse(time.RFC3339, pb.Reached)
	require.NoError(t, perr, "reached %q", pb.Reached)
	require.WithinDuration(t, time.Now(), reached, time.Hour)
	require.Equal(t, p.srv.cfg.HostID, pb.HostID)
	require.Equal(t, p.srv.instance, pb.Instance)
	require.Equal(t, p.client.cfg.HostID != "" && pb.HostID == p.client.cfg.HostID, pb.SameHost)
	require.Equal(t, "xxh3", pb.Checksum, "both ends run the default")
	pb.Reached, pb.HostID, pb.Instance, pb.SameHost, pb.Checksum = "", "", "", false, ""
	require.Equal(t, map[string]PeerReport{"b": {Addr: addrOf(p.srv)}}, map[string]PeerReport{"b": pb}, "nothing else")
	require.Len(t, cs.Transfers.Recent, 1)
	r := timing(t, cs.Transfers.Recent[0], false)
	// 3 MiB takes 256 KiB chunks (chunkFor), enough for two streams.
	require.Equal(t, RecordReport{ID: 1, Streams: 2, Src: "/f", Dst: "b:/d/f", Path: "tcp", BytesDone: 3 << 20, BytesTotal: 3 << 20, Tensors: 1, Mode: "whole", Checksum: "xxh3"}, r)
	require.Eventually(t, func() bool { return p.srv.Stats().Transfers.Active == 0 }, 5*time.Second, 5*time.Millisecond)
	ss := p.srv.Stats()
	require.Equal(t, int64(1), ss.Copies.TCP)
	require.Equal(t, RecordReport{ID: 1, Streams: 2, Src: "a", Dst: "/d/f", Path: "tcp", BytesDone: 3 << 20, BytesTotal: 3 << 20, Tensors: 1, Mode: "whole", Checksum: "xxh3"}, timing(t, ss.Transfers.Recent[0], true))

	// a pull: total and tensors are known once the server answers
	_, err := pull(ctx, p.client, p.a, "b", "/d/f", "/g")
	require.NoError(t, err)
	cs = p.client.Stats()
	require.Equal(t, int64(2), cs.Copies.TCP)
	require.Equal(t, RecordReport{ID: 2, Streams: 2, Src: "b:/d/f", Dst: "/g", Path: "tcp", BytesDone: 3 << 20, BytesTotal: 3 << 20, Tensors: 1, Mode: "whole", Checksum: "xxh3"}, timing(t, cs.Transfers.Recent[1], true))

	// failures are recorded with their error and do not count as copies
	_, err = push(ctx, p.client, p.a, "/f", "b", "/missing/f")
	requireErrno(t, err, syscall.ENOENT)
	cs = p.client.Stats()
	require.Equal(t, int64(2), cs.Copies.TCP)
	require.Zero(t, cs.Transfers.Active)
	last := cs.Transfers.Recent[len(cs.Transfers.Recent)-1]
	require.Contains(t, last.Error, "/missing")
	require.Equal(t, "b:/missing/f", last.Dst)
	require.Eventually(t, func() bool {
		ss := p.srv.Stats()
		return ss.Transfers.Active == 0 && ss.Transfers.Recent[len(ss.Transfers.Recent)-1].Error != ""
	}, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, int64(2), p.srv.Stats().Copies.TCP)

	// recent is bounded
	for i := 0; i < 2*recentMax; i++ {
		_, err := push(ctx, p.client, p.a, "/f", "nope", "/x")
		require.Error(t, err)
	}
	cs = p.client.Stats()
	require.Len(t, cs.Transfers.Recent, recentMax)
	js, err := json.Marshal(cs)
	require.NoError(t, err)
	require.Less(t, len(js), 64<<10)

	// Track: local and ipc paths count in their own copies
	_, end := p.client.Track("/a", "/b", "local", []Meta{{NBytes: 1}})
	end(nil)
	_, end = p.client.Track("/a", "/b", "ipc", []Meta{{NBytes: 1}})
	end(nil)
	cs = p.client.Stats()
	require.Equal(t, int64(1), cs.Copies.Local)
	require.Equal(t, int64(1), cs.Copies.IPC)
	require.Equal(t, int64(2), cs.Copies.TCP)
}

// Stats may be read at any moment (the fs layer serves the stats xattr
// while copies run): run with -race.
func TestStatsDuringCopies(t *testing.T) {
	p := newPair(t, func(c *Config) { c.ChunkSize = 64 << 10 })
	p.b.put("/f", pattern(60, 2<<20))
	p.a.put("/f", pattern(61, 2<<20))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, s := range []*Service{p.client, p.srv} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				st := s.Stats()
				for _, r := range st.Transfers.Recent {
					_ = r.BytesTotal + r.Tensors
				}
				time.Sleep(100 * time.Microsecond)
			}
		}()
	}
	for i := 0; i < 5; i++ {
		_, err := pull(context.Background(), p.client, p.a, "b", "/f", fmt.Sprintf("/g%d", i))
		require.NoError(t, err)
		_, err = push(context.Background(), p.client, p.a, "/f", "b", fmt.Sprintf("/h%d", i))
		require.NoError(t, err)
	}
	close(stop)
	wg.Wait()
}

// Close is idempotent and ends idle authenticated connections.
func TestCloseDropsConnections(t *testing.T) {
	b := newMemLocal()
	srv := startServer(t, "b", b, testSecret, nil)
	c := authed(t, srv)
	done := make(chan struct{})
	go func() { srv.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("Close hangs with an idle connection open")
	}
	expectClosed(t, c, 2*time.Second)
	require.NoError(t, srv.Close())
	_, err := net.DialTimeout("tcp", addrOf(srv), time.Second)
	requireErrno(t, err, syscall.ECONNREFUSED)
}

// A client that connects and stays silent, or dribbles a frame, or idles
// after authenticating, is dropped after the server's Timeout.
func TestIdleClientDropped(t *testing.T) {
	const timeout = 300 * time.Millisecond
	srv := startServer(t, "b", newMemLocal(), testSecret, func(c *Config) { c.Timeout = timeout })

	c := rawClient(t, addrOf(srv))
	start := time.Now()
	expectClosed(t, c, 3*time.Second)
	require.GreaterOrEqual(t, time.Since(start), timeout*9/10)

	c = authed(t, srv)
	expectClosed(t, c, 3*time.Second)

	// a frame header promising 4 MiB, then one byte at a time
	c = rawClient(t, addrOf(srv))
	_, err := c.c.Write([]byte{0, 0x40, 0, 0, frameHello})
	require.NoError(t, err)
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(timeout / 4):
				c.c.Write([]byte{'x'})
			}
		}
	}()
	expectClosed(t, c, 3*time.Second)
	close(stop)
}

// TestLongCommitKeepsAlive: a destination whose commit takes longer than the
// timeout (thousands of renames under load) keeps the sender waiting with
// keepalives instead of failing it with ETIMEDOUT.
func TestLongCommitKeepsAlive(t *testing.T) {
	b := newMemLocal()
	b.commitDelay = 1500 * time.Millisecond
	short := func(c *Config) { c.Timeout = 500 * time.Millisecond }
	srv := startServer(t, "b", b, testSecret, short)
	a := newMemLocal()
	a.put("/x", []byte("payload"))
	cli := newClient(t, "a", a, testSecret, map[string]string{"b": addrOf(srv)}, short)
	n, err := push(context.Background(), cli, a, "/x", "b", "/x")
	require.NoError(t, err, "a commit longer than the timeout is not silence")
	require.Equal(t, 1, n)
}

// TestConnectionReuse: consecutive copies to one peer reuse one authenticated
// connection; a connection the peer has dropped (its restart) is not reused.
func TestConnectionReuse(t *testing.T) {
	b := newMemLocal()
	srv := startServer(t, "b", b, testSecret, nil)
	a := newMemLocal()
	a.put("/x", []byte("payload"))
	cli := newClient(t, "a", a, testSecret, map[string]string{"b": addrOf(srv)}, nil)
	for i := 0; i < 20; i++ {
		_, err := push(context.Background(), cli, a, "/x", "b", fmt.Sprintf("/y%d", i))
		require.NoError(t, err)
	}
	cli.mu.Lock()
	idle := len(cli.idle["b"])
	cli.mu.Unlock()
	require.Equal(t, 1, idle, "one connection served all 20 copies")
	srv.mu.Lock()
	open := len(srv.conns)
	srv.mu.Unlock()
	require.Equal(t, 1, open, "the server saw one connection")

	// The server goes away and comes back on the same address: the pooled
	// connection is dead, and the next copy dials afresh.
	addr := addrOf(srv)
	srv.Close()
	srv2 := startServer(t, "b", b, testSecret, func(c *Config) { c.Listen = addr })
	_ = srv2
	_, err := push(context.Background(), cli, a, "/x", "b", "/z")
	require.NoError(t, err)
}

// TestIdleConnectionKeptAlive: a connection idle for several of both
// sides' timeouts (a server drops a silent connection at its timeout) stays
// open by keepalives and serves the next copy, with no new dial; stats count
// it on both sides; past IdleTimeout it is closed.
func TestIdleConnectionKeptAlive(t *testing.T) {
	const timeout = 300 * time.Millisecond
	b := newMemLocal()
	srv := startServer(t, "b", b, testSecret, func(c *Config) { c.Timeout = timeout })
	a := newMemLocal()
	a.put("/x", []byte("payload"))
	cli := newClient(t, "a", a, testSecret, map[string]string{"b": addrOf(srv)}, func(c *Config) {
		c.Timeout, c.IdleTimeout = timeout, 2*time.Second
	})
	_, err := push(context.Background(), cli, a, "/x", "b", "/y0")
	require.NoError(t, err)
	time.Sleep(4 * timeout)
	require.EqualValues(t, 1, cli.Stats().Connections.Idle)
	require.EqualValues(t, 1, srv.Stats().Connections.Waiting)
	_, err = push(context.Background(), cli, a, "/x", "b", "/y1")
	require.NoError(t, err)
	srv.mu.Lock()
	open := len(srv.conns)
	srv.mu.Unlock()
	require.Equal(t, 1, open, "the idle connection served the second copy")
	require.Eventually(t, func() bool {
		return cli.Stats().Connections.Idle == 0 && srv.Stats().Connections.Waiting == 0
	}, 5*time.Second, 20*time.Millisecond, "closed past IdleTimeout")
}

// TestCallerLookup: a caller pid that takes a while to look up is absent
// from the record while the lookup runs, and the record does not show as
// finished (took_us) before its pid and error are in it, however short the
// copy; a pid given outright is there at once.
func TestCallerLookup(t *testing.T) {
	s, err := New(Config{}, nil)
	require.NoError(t, err)
	release := make(chan struct{})
	ctx := WithCallerLookup(context.Background(), func() int { <-release; return 4242 })
	_, end := s.TrackCtx(ctx, "/a", "b:/a", "tcp", []Meta{{NBytes: 1}})
	ended := make(chan struct{})
	go func() {
		end(errors.New("peer gone"))
		close(ended)
	}()
	for range 50 {
		r := s.Stats().Transfers.Recent[0]
		require.Zero(t, r.PID, "not known yet")
		require.Zero(t, r.TookUS, "not finished while its pid is unknown")
		time.Sleep(time.Millisecond)
	}
	close(release)
	<-ended
	r := s.Stats().Transfers.Recent[0]
	require.Equal(t, 4242, r.PID, "known once the record ended")
	require.Equal(t, "peer gone", r.Error)
	require.Positive(t, r.TookUS)

	_, end = s.TrackCtx(WithCallerLookup(context.Background(), func() int { return 7 }), "/a", "b:/a", "tcp", []Meta{{NBytes: 1}})
	require.Eventually(t, func() bool { return s.Stats().Transfers.Recent[1].PID == 7 }, time.Second, time.Millisecond)
	end(nil)
}

// TestClosedConnNeverPooled: a connection closed to stop a transfer's
// goroutines is not handed to the next copy, even when the copy succeeded
// (TestConnectionReuse's flake: a small push's reply beat its sender's
// return, send closed the connection, and the pool kept it).
func TestClosedConnNeverPooled(t *testing.T) {
	s, err := New(Config{Timeout: 5 * time.Second}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	near, far := net.Pipe()
	defer far.Close()
	c := newConn(near, 5*time.Second, "b")
	c.c.Close()
	s.done("b", c, true, nil)
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Empty(t, s.idle["b"], "a closed connection is not pooled")
}

// TestBatchedWrites: a destination that takes batches (BatchWriter: GPU
// memory) gets a tree's small chunks gathered, far fewer writes than
// chunks, every byte in place; with a corrupt chunk among them the copy
// fails with EIO and nothing is committed.
func TestBatchedWrites(t *testing.T) {
	p := newPair(t, nil)
	p.b.batch = true
	want := makeTree(p.a, "/tree", 300, 10)
	n, err := push(context.Background(), p.client, p.a, "/tree", "b", "/dst")
	require.NoError(t, err)
	require.Equal(t, 300, n)
	for rel, data := range want {
		got, _, ok := p.b.get("/dst/" + rel)
		require.True(t, ok, rel)
		require.True(t, bytes.Equal(data, got), rel)
	}
	p.b.mu.Lock()
	batches := p.b.batches
	p.b.mu.Unlock()
	require.Positive(t, batches)
	require.Less(t, batches, int64(300), "chunks gathered into batches")
	requireClean(t, p.b)

	// A destination that declines batches, past the first batch's bytes:
	// the chunks gathered so far, then the rest, one by one.
	q := newPair(t, nil)
	wantQ := makeTree(q.a, "/tree", 200, 8<<10)
	n, err = push(context.Background(), q.client, q.a, "/tree", "b", "/dst")
	require.NoError(t, err)
	require.Equal(t, 200, n)
	for rel, data := range wantQ {
		got, _, ok := q.b.get("/dst/" + rel)
		require.True(t, ok, rel)
		require.True(t, bytes.Equal(data, got), rel)
	}
	require.Zero(t, q.b.batches)
	requireClean(t, q.b)

}

// TestChecks: Check and CheckPull answer as a put and a get would before
// any byte moves, and move nothing: no byte written, no destination left
// open, no commit, and the connection kept for the next copy. A check
// that says data or memory follow it is refused (EPROTO).
func TestChecks(t *testing.T) {
	p := newPair(t, nil)
	p.a.put("/f", pattern(1, 64))
	p.b.put("/dst", pattern(2, 128))
	ctx := context.Background()
	before := p.b.snapshot()
	srcs, _, err := p.a.Get("/f", Range{Set: true, Off: 0, Len: 64, HasLen: true})
	require.NoError(t, err)
	in := func(off int64) []Source {
		m := srcs[0].Meta()
		m.InPlace, m.Off = true, off
		return []Source{metaSource{srcs[0], m}}
	}
	require.NoError(t, p.client.Check(ctx, "b", "/dst", in(64), false))
	requireErrno(t, p.client.Check(ctx, "b", "/dst", in(65), false), syscall.EINVAL, "past the end")
	requireErrno(t, p.client.Check(ctx, "b", "/missing", in(0), false), syscall.ENOENT)
	requireErrno(t, p.client.Check(ctx, "zz", "/dst", in(0), false), syscall.ENOENT, "unknown peer")
	into := func(isDir bool, metas []Meta) (Dest, error) { return p.a.Put("/f", isDir, metas) }
	require.NoError(t, p.client.CheckPull(ctx, Pull{Peer: "b", Path: "/dst", Range: Range{Set: true, Off: 64, Len: 64, HasLen: true}, Dst: "/f", DstRange: Range{Set: true}}, into))
	requireErrno(t, p.client.CheckPull(ctx, Pull{Peer: "b", Path: "/dst", Range: Range{Set: true, Off: 100, Len: 64, HasLen: true}, Dst: "/f", DstRange: Range{Set: true}}, into), syscall.EINVAL, "source range past its end")
	requireErrno(t, p.client.CheckPull(ctx, Pull{Peer: "b", Path: "/dst", Dst: "/f", DstRange: Range{Set: true, Off: 1}}, into), syscall.EINVAL, "128 bytes do not fit at 1 of 64")
	// (Range lists, which this Local does not serve, are checked through
	// the namespace: TestInPlaceRefusalsSeveralPeers.)
	require.Equal(t, before, p.b.snapshot())
	data, _, _ := p.a.get("/f")
	require.Equal(t, pattern(1, 64), data)
	require.Zero(t, p.a.counts().Commits)
	require.Zero(t, p.b.counts().Commits)
	srcs[0].Close()
	requireClean(t, p.a)
	requireClean(t, p.b)

	// A check must be the whole request: one with IPC descriptors or early
	// data is refused, and the server drops the connection.
	c := rawClient(t, addrOf(p.srv))
	require.NoError(t, clientHandshake(c, "a", testSecret))
	require.NoError(t, c.sendJSON(frameRequest, request{Op: "check-put", Path: "/dst", Tensors: []Meta{{DType: "U8", Shape: "8", NBytes: 8, InPlace: true}}, Early: true, Token: []byte("0123456789abcdef")}))
	we := expectError(t, c)
	require.Equal(t, "EPROTO", we.Errno)
	expectClosed(t, c, 5*time.Second)
	require.Equal(t, before, p.b.snapshot())
}

// metaSource is a Source with another Meta (an in-place descriptor of it).
type metaSource struct {
	Source
	m Meta
}

func (s metaSource) Meta() Meta { return s.m }
