package transfer

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tcpPair is a connected pair of loopback TCP connections: near wrapped as
// a conn whose reads spin for spin, far raw.
func tcpPair(t *testing.T, spin time.Duration) (near *conn, far net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	far = <-acc
	require.NotNil(t, far)
	t.Cleanup(func() { nc.Close(); far.Close() })
	near = newConn(nc, 5*time.Second, "far")
	near.c.spin = spin
	return near, far
}

// TestSpinRead: a read on a spinning connection gets what arrives while it
// polls and what arrives after it has gone to sleep in the poller, in
// order; it honours the read deadline (a timeout, as net.Conn's); it sees
// the peer's close (io.EOF) and a reset (an error, not data); and its
// readv twin (readFullV) fills its slices across arrivals of both kinds.
func TestSpinRead(t *testing.T) {
	t.Run("within and after the spin", func(t *testing.T) {
		for _, spin := range []time.Duration{50 * time.Millisecond, time.Millisecond} {
			near, far := tcpPair(t, spin)
			go func() {
				time.Sleep(5 * time.Millisecond) // inside a 50 ms spin, past a 1 ms one
				far.Write([]byte("hello"))
				time.Sleep(20 * time.Millisecond)
				far.Write([]byte(" world"))
			}()
			got := make([]byte, 11)
			_, err := io.ReadFull(near.c, got)
			require.NoError(t, err, "spin %v", spin)
			require.Equal(t, "hello world", string(got))
		}
	})
	t.Run("deadline", func(t *testing.T) {
		near, _ := tcpPair(t, time.Millisecond)
		near.c.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
		start := time.Now()
		_, err := near.c.Read(make([]byte, 8))
		var ne net.Error
		require.True(t, errors.As(err, &ne) && ne.Timeout(), "%v", err)
		require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "%v", err)
		require.GreaterOrEqual(t, time.Since(start), 25*time.Millisecond)
		require.Less(t, time.Since(start), 2*time.Second)
		requireErrno(t, netErr(err), syscall.ETIMEDOUT)
	})
	t.Run("close and reset", func(t *testing.T) {
		near, far := tcpPair(t, 10*time.Millisecond)
		far.Write([]byte("x"))
		far.Close()
		b := make([]byte, 4)
		n, err := near.c.Read(b)
		require.NoError(t, err)
		require.Equal(t, "x", string(b[:n]))
		_, err = near.c.Read(b)
		require.ErrorIs(t, err, io.EOF)

		near, far = tcpPair(t, 10*time.Millisecond)
		far.(*net.TCPConn).SetLinger(0) // close sends a reset
		time.AfterFunc(3*time.Millisecond, func() { far.Close() })
		_, err = near.c.Read(b)
		require.Error(t, err)
		require.NotErrorIs(t, err, io.EOF)
		requireErrno(t, netErr(err), syscall.EIO)
	})
	t.Run("own close while waiting", func(t *testing.T) {
		near, _ := tcpPair(t, time.Millisecond)
		time.AfterFunc(20*time.Millisecond, func() { near.c.Close() })
		_, err := near.c.Read(make([]byte, 4))
		require.ErrorIs(t, err, net.ErrClosed)
	})
	t.Run("asleep after a keepalive", func(t *testing.T) {
		// An idle connection's keepalives (about one a second) must not
		// each start a spin; a frame that is not one spins again.
		near, far := tcpPair(t, 200*time.Millisecond)
		near.max = MaxFrame
		go func() {
			writeFrame(far, frameKeepalive, nil)
			time.Sleep(60 * time.Millisecond)
			writeFrame(far, frameOK, []byte("{}"))
		}()
		start := time.Now()
		typ, _, err := near.recv()
		require.NoError(t, err)
		require.Equal(t, frameOK, typ)
		require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
		go func() {
			time.Sleep(20 * time.Millisecond)
			writeFrame(far, frameOK, []byte("{}"))
		}()
		near.c.polls.Store(0)
		typ, _, err = near.recv()
		require.NoError(t, err)
		require.Equal(t, frameOK, typ)
		require.Greater(t, near.c.polls.Load(), int64(100), "after an OK frame the wait spins")

		near.c.polls.Store(0)
		go func() {
			writeFrame(far, frameKeepalive, nil)
			time.Sleep(40 * time.Millisecond)
			writeFrame(far, frameOK, []byte("{}"))
		}()
		time.Sleep(10 * time.Millisecond) // the keepalive is there before the read
		typ, _, err = near.recv()
		require.NoError(t, err)
		require.Equal(t, frameOK, typ)
		require.Less(t, near.c.polls.Load(), int64(10), "after a keepalive the wait sleeps")
	})
	t.Run("readv", func(t *testing.T) {
		near, far := tcpPair(t, 2*time.Millisecond)
		go func() {
			far.Write([]byte("abc"))
			time.Sleep(time.Millisecond)
			far.Write([]byte("defg"))
			time.Sleep(30 * time.Millisecond) // the reader sleeps in the poller
			far.Write([]byte("hij"))
		}()
		a, b, c := make([]byte, 2), make([]byte, 6), make([]byte, 2)
		near.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		require.NoError(t, near.readFullV([][]byte{a, b, c}, false))
		require.Equal(t, "abcdefghij", string(a)+string(b)+string(c))
	})
}

// TestSpinSilentPeer: with spinning reads, a peer that never answers still
// fails a copy within the timeout (the spin, far shorter, does not hide the
// deadline).
func TestSpinSilentPeer(t *testing.T) {
	const timeout = 300 * time.Millisecond
	mute := rawServer(t, func(nc net.Conn) {
		c := wrapConn(nc, "raw")
		if serverHandshake(c, "mute", testSecret, ProtocolVersion) == nil {
			io.Copy(io.Discard, nc)
		}
	})
	a := newMemLocal()
	a.put("/f", pattern(40, 1000))
	cl := newClient(t, "a", a, testSecret, map[string]string{"mute": mute}, func(c *Config) { c.Timeout, c.Spin = timeout, 5*time.Millisecond })
	start := time.Now()
	_, err := push(context.Background(), cl, a, "/f", "mute", "/f")
	requireErrno(t, err, syscall.ETIMEDOUT)
	require.Less(t, time.Since(start), 3*timeout)
	requireClean(t, a)
}

// TestReadAhead: readSomeV with ahead takes the bytes past iov that came
// with it (at most readAhead), never waits for more, and every later read
// of the connection (the frame reader, exactReader, another readSomeV)
// gets them first, in order; a connection holding such bytes is not
// pooled as idle. With nothing in the socket it returns at once, having
// read nothing.
func TestReadAhead(t *testing.T) {
	near, far := tcpPair(t, 0)
	near.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	rest := "0123456789abcdefghijklmnopqrstuvwxyz" // more than readAhead
	far.Write([]byte("chunk" + rest))
	time.Sleep(20 * time.Millisecond) // all of it in the socket
	a := make([]byte, 5)
	require.NoError(t, near.readFullV([][]byte{a}, true))
	require.Equal(t, "chunk", string(a))
	require.Equal(t, rest[:readAhead], string(near.c.pre), "the bytes behind the chunk, as many as fit")
	require.False(t, alive(near), "bytes waiting: not idle")

	b := make([]byte, 3)
	_, err := io.ReadFull(exactReader{near}, b)
	require.NoError(t, err)
	require.Equal(t, rest[:3], string(b))
	c, d := make([]byte, 4), make([]byte, len(rest)-7)
	require.NoError(t, near.readFullV([][]byte{c, d}, false))
	require.Equal(t, rest[3:], string(c)+string(d), "pre first, then the socket")
	require.Empty(t, near.c.pre)

	// Nothing in the socket: no wait, nothing read.
	n, err := near.readSomeV([][]byte{make([]byte, 4)}, true)
	require.NoError(t, err)
	require.Zero(t, n)
	// Nothing behind the chunk: it returns at once with none ahead; what
	// comes later goes through the buffered reader as before.
	done := make(chan error, 1)
	e := make([]byte, 4)
	go func() { done <- near.readFullV([][]byte{e}, true) }()
	far.Write([]byte("tail"))
	require.NoError(t, <-done)
	require.Equal(t, "tail", string(e))
	require.Empty(t, near.c.pre)
	far.Write([]byte("frame"))
	f := make([]byte, 5)
	_, err = io.ReadFull(near.r, f)
	require.NoError(t, err)
	require.Equal(t, "frame", string(f))
}

// TestRespin: a read asleep in the poller, its spin over, polls again at
// respin (the reply reader of a push whose data outlasted the spin), gets
// what arrives then without an error, and keeps the deadline respin gave:
// a silent peer still times out (a real deadline error, not a kick).
func TestRespin(t *testing.T) {
	near, far := tcpPair(t, 20*time.Millisecond)
	got := make(chan error, 1)
	buf := make([]byte, 5)
	go func() {
		_, err := io.ReadFull(near.c, buf)
		got <- err
	}()
	time.Sleep(100 * time.Millisecond) // past the spin: asleep in the poller
	polls := near.c.polls.Load()
	require.NotZero(t, polls, "it spun first")
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, polls, near.c.polls.Load(), "then slept")
	near.c.respin(time.Now().Add(5 * time.Second))
	require.Eventually(t, func() bool { return near.c.polls.Load() > polls }, time.Second, time.Millisecond, "spinning again")
	_, err := far.Write([]byte("reply"))
	require.NoError(t, err)
	require.NoError(t, <-got, "the kick is not the caller's error")
	require.Equal(t, "reply", string(buf))

	// A respin whose deadline passes with nothing to read: a timeout.
	near.c.respin(time.Now().Add(60 * time.Millisecond))
	start := time.Now()
	_, err = near.c.Read(buf)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond, "at respin's deadline, not at once")

	// Without a spin, respin only sets the deadline.
	plain, _ := tcpPair(t, 0)
	plain.c.respin(time.Now().Add(30 * time.Millisecond))
	_, err = plain.c.Read(buf)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
}

// TestRespinNotLeftPending: a respin that no read took (the reply was
// already read) is ended by the next deadline set on the connection: a
// later short wait times out at its own deadline, not at respin's.
func TestRespinNotLeftPending(t *testing.T) {
	near, _ := tcpPair(t, time.Millisecond)
	near.c.respin(time.Now().Add(5 * time.Second))
	near.c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	start := time.Now()
	_, err := near.c.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.Less(t, time.Since(start), 2*time.Second, "the 100 ms deadline was stretched to respin's")
}
