package transfer

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// closingConn is a net.Conn that remembers being closed, so that a
// connection closed to stop a transfer's goroutines is never pooled for the
// next copy (which would then pay a dial and a handshake after finding it
// dead).
type closingConn struct {
	net.Conn
	closed atomic.Bool
	// spin is how long a read that finds the socket empty polls it before
	// it sleeps in the runtime's poller (Config.Spin); 0: it sleeps at once.
	spin time.Duration
	// idle, set while the last frame read was a keepalive, makes reads
	// sleep at once: an idle connection (a pooled one, a lease channel)
	// gets a keepalive every second or so, and a spin after each would
	// cost a core a millisecond a second per connection, for nothing.
	idle atomic.Bool
	// polls counts the reads that found nothing while spinning (tests).
	polls atomic.Int64
	// raw is the socket's RawConn (nil when the connection is not a
	// socket: tests' pipes), got once: every spinning read, readv and
	// liveness peek uses it.
	raw syscall.RawConn
	// pre holds the connection's next bytes when a readv read past what
	// it needed (conn.readSomeV's ahead, in preBuf): every read serves them
	// first, so that nothing is out of order whoever reads next.
	pre    []byte
	preBuf [readAhead]byte
	// kick, when set (by respin), turns the next deadline error of a read
	// into a fresh spin under kickDeadline.
	kickMu       sync.Mutex
	kick         bool
	kickDeadline time.Time
	// ownerPID is the peer's process, once a memfd handle naming it was
	// checked against a TCP connection (checkOwner), and ownerStart its
	// start time: the answer holds only while that process lives (its pid
	// may name another process after, whose start time differs).
	ownerMu    sync.Mutex
	ownerPID   int
	ownerStart string
}

// readAhead is the most bytes a data stream's readv takes past a chunk's
// bytes (conn.readSomeV): the next frame's and chunk's headers, which cost
// a read(2) each when read apart (5.6 µs a read on the 2-core VM, a tenth
// of a 1000 x 8 KiB scatter's receiving time).
const readAhead = frameHeaderLen + dataHeaderLen

// spinFor is how long a read on c may poll now: spin, or 0 while c is idle.
func (c *closingConn) spinFor() time.Duration {
	if c.idle.Load() {
		return 0
	}
	return c.spin
}

// Read implements io.Reader: with spin set, a read that finds nothing in
// the socket tries again for up to spin before it waits in the runtime's
// poller (spinRead); else net.Conn's Read. A read that respin woke spins
// again, inside this call: the caller's frame parse never sees the kick.
func (c *closingConn) Read(p []byte) (int, error) {
	for {
		n, err := c.read(p)
		if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && c.kicked() {
			continue
		}
		return n, err
	}
}

// respin makes a read that waits in the poller, its spin over, spin again
// at once, under deadline from then on; with no read waiting, the next
// one does. Why: a push's reply reader starts with the data, which takes
// longer than the spin on 8 MiB and more, so it slept through it and the
// reply, tens of µs after the last byte, then cost the poller's wake-up
// (a thread woken from epoll_wait, then the goroutine). No-op without a
// spin.
func (c *closingConn) respin(deadline time.Time) {
	if c.spin <= 0 || c.raw == nil {
		c.Conn.SetReadDeadline(deadline)
		return
	}
	c.kickMu.Lock()
	defer c.kickMu.Unlock()
	c.kick, c.kickDeadline = true, deadline
	c.Conn.SetReadDeadline(time.Unix(1, 0)) // wakes a read in the poller
}

// SetReadDeadline implements net.Conn, ending a kick respin left pending
// (a reply read before the kick, say): the next real deadline error, of
// a 100 ms wait perhaps, must not be taken for the kick and stretched to
// respin's deadline.
func (c *closingConn) SetReadDeadline(t time.Time) error {
	c.kickMu.Lock()
	defer c.kickMu.Unlock()
	c.kick = false
	return c.Conn.SetReadDeadline(t)
}

// kicked reports whether respin caused the deadline error just seen,
// restoring the deadline respin gave; false: a real timeout.
func (c *closingConn) kicked() bool {
	c.kickMu.Lock()
	defer c.kickMu.Unlock()
	if !c.kick {
		return false
	}
	c.kick = false
	c.Conn.SetReadDeadline(c.kickDeadline)
	return true
}

func (c *closingConn) read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	spin := c.spinFor()
	if spin <= 0 || len(p) == 0 || c.raw == nil {
		return c.Conn.Read(p)
	}
	var n int
	var rerr error
	err := spinRead(c.raw, spin, func(fd int) bool {
		n, rerr = unix.Read(fd, p)
		if rerr == unix.EAGAIN || rerr == unix.EINTR {
			c.polls.Add(1)
			return false
		}
		switch {
		case rerr != nil:
			n, rerr = 0, os.NewSyscallError("read", rerr)
		case n == 0:
			rerr = io.EOF
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	return n, rerr
}

// spinRead runs read on the socket of sc until it reports done (it got
// bytes, an error or the end: anything but EAGAIN), calling it again for up
// to spin before it leaves the wait to the runtime's poller (which honours
// the read deadline; the spin, at most spin long, does not look at it).
//
// Why: a thread that sleeps in the poller is woken by the kernel, then the
// runtime, when the peer's frame arrives: on the H200 host (a KVM guest)
// 8-16 µs each way of a copy's request and reply, and code that runs cold
// after the sleep; a copy waits for its reply, and a daemon for the next
// request of a burst, hot. UCX and NCCL poll for the same reason. Errors:
// the poller's (a deadline, a closed connection).
func spinRead(sc syscall.RawConn, spin time.Duration, read func(fd int) (done bool)) error {
	var until time.Time
	return sc.Read(func(fd uintptr) bool {
		for {
			if read(int(fd)) {
				return true
			}
			if spin <= 0 {
				return false
			}
			now := time.Now()
			if until.IsZero() {
				until = now.Add(spin)
			} else if now.After(until) {
				spin = 0 // once: after the poller's wake-up, one read
				return false
			}
		}
	})
}

// Close closes the connection and remembers it, so that done never pools it.
func (c *closingConn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

// isOwner reports whether pid is the owner checkOwner found and the same
// process still runs under it.
func (c *closingConn) isOwner(pid int) bool {
	c.ownerMu.Lock()
	defer c.ownerMu.Unlock()
	return pid != 0 && pid == c.ownerPID && processStart(pid) == c.ownerStart
}

// setOwner keeps pid, whose process started at start, as the owner.
func (c *closingConn) setOwner(pid int, start string) {
	c.ownerMu.Lock()
	defer c.ownerMu.Unlock()
	c.ownerPID, c.ownerStart = pid, start
}

// SyscallConn exposes the socket for alive's non-blocking peek and the
// reads straight from it. Errors: errors.ErrUnsupported for a connection
// that is not a socket.
func (c *closingConn) SyscallConn() (syscall.RawConn, error) {
	if c.raw == nil {
		return nil, errors.ErrUnsupported
	}
	return c.raw, nil
}

// remoteLabel names the far end of an accepted connection in the log: its
// address, or for a client of the abstract unix socket (which has no
// name) its process and user.
func remoteLabel(nc net.Conn) string {
	if a := nc.RemoteAddr(); a != nil && a.String() != "" && a.String() != "@" {
		return a.String()
	}
	if cred, err := peerCred(nc); err == nil {
		return fmt.Sprintf("unix socket (pid %d, uid %d)", cred.Pid, cred.Uid)
	}
	return "unix socket"
}

func newConn(nc net.Conn, timeout time.Duration, peer string) *conn {
	cc := &closingConn{Conn: nc}
	if sc, ok := nc.(syscall.Conn); ok {
		cc.raw, _ = sc.SyscallConn()
	}
	return &conn{c: cc, r: bufio.NewReaderSize(cc, 256<<10), w: bufio.NewWriterSize(cc, 256<<10), timeout: timeout, peer: peer}
}

// conn is one authenticated connection with deadline handling.
type conn struct {
	c       *closingConn
	r       *bufio.Reader
	w       *bufio.Writer
	timeout time.Duration
	buf     []byte
	enc     []byte // encode's buffer
	// iovAhead is readSomeV's iov with the read-ahead behind it.
	iovAhead [][]byte
	// readIOV is readFullV's iov, what is left of the one it was given.
	readIOV [][]byte
	peer    string
	hostID  string
	// name is the name the peer gave in its handshake; local, pid and ns,
	// for a dialled one, the unix socket, process and namespaces it
	// offered (learnLocal).
	name  string
	local string
	pid   int
	ns    string
	max   uint32 // largest frame accepted now
	// instance, imports, noChecksum, xxh3, recheck and binds: the peer's,
	// from the handshake.
	instance   string
	imports    []string
	noChecksum bool
	xxh3       bool
	recheck    bool
	binds      bool
	// iov holds writeFrames' frames for a writev (one writer at a time).
	iov [][]byte
	// progress, when set, gets the bytes_done of keepalives that carry a
	// progressMsg (an IPC put's receiver reporting to its sender).
	progress func(bytesDone int64)
	// lost is why the peer is gone (hung up, or a keepalive could not be
	// written), as the keepalive loop found it during a call under
	// whileCopying; nil while it is there.
	lost atomic.Pointer[Error]
	// onBeat, when set, runs at each keepalive the peer sends (on the
	// reading goroutine): a sender's data streams then push their write
	// deadlines on (sendChunks).
	onBeat atomic.Pointer[func()]
}

// gone is the error of a peer that went away while this node copied for it
// (an IPC copy reads the peer's memory, which outlives the peer: without
// it the copy ran to its end, pins held, seconds after the peer was
// killed); nil while the peer is there. Copies check it between pieces.
func (c *conn) gone() error {
	if e := c.lost.Load(); e != nil {
		return e
	}
	return nil
}

// hungUp reports whether the peer of c has closed its end or reset it
// (a peek that finds the end of the stream, or an error), without
// consuming anything: bytes waiting are a peer that is there.
func hungUp(c *conn) (bool, error) {
	raw, err := c.c.SyscallConn()
	if err != nil {
		return false, nil // not a socket (tests' pipes): writes tell instead
	}
	var b [1]byte
	var n int
	var rerr error
	// Control, not Read: Read fails at once, without looking, once the
	// connection's read deadline (armed by its last exchange) has passed,
	// as it has during a copy longer than the timeout.
	if err := raw.Control(func(fd uintptr) {
		n, _, rerr = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	}); err != nil {
		return false, nil // closed here: not the peer's doing
	}
	switch {
	case rerr == syscall.EAGAIN || rerr == syscall.EINTR:
		return false, nil
	case rerr != nil:
		return true, rerr
	}
	return n == 0, nil
}

func (c *conn) send(typ byte, payload []byte) error {
	c.c.SetWriteDeadline(time.Now().Add(c.timeout))
	if err := writeFrame(c.w, typ, payload); err != nil {
		return err
	}
	return nil
}

// writeFrames sends whole frames that sit in buffers of the caller's (a
// data stream's chunks, read behind their headers): into the connection's
// write buffer when they fit behind what waits there (small puts: request,
// data and done in one write), else straight to the socket after what
// waits, in one writev, so that megabytes are not copied into the write
// buffer first.
//
// more: a frame follows at once (a small put's done frame behind its last
// chunks), so frames that fit stay in the buffer for its write to carry:
// the destination then gets request, data and done in one segment and
// wakes once, not again for a done frame a write later.
func (c *conn) writeFrames(frames [][]byte, more bool) error {
	c.c.SetWriteDeadline(time.Now().Add(c.timeout))
	n := 0
	for _, f := range frames {
		n += len(f)
	}
	if n <= c.w.Available() && (c.w.Buffered() > 0 || more) {
		for _, f := range frames {
			c.w.Write(f)
		}
		if more {
			return nil
		}
		return c.w.Flush()
	}
	if err := c.w.Flush(); err != nil {
		return err
	}
	// WriteTo consumes what it is given (it clears the entries it wrote):
	// a copy of the slice headers, in the connection's reused array.
	c.iov = append(c.iov[:0], frames...)
	bufs := net.Buffers(c.iov)
	defer clear(c.iov)
	switch nc := c.c.Conn.(type) {
	case *net.TCPConn, *net.UnixConn:
		// The socket itself: net.Buffers writes it with writev (through
		// the wrapper, one write per frame).
		_, err := bufs.WriteTo(nc)
		return err
	}
	_, err := bufs.WriteTo(c.c)
	return err
}

// exactReader reads a connection's bytes without reading ahead: what its
// bufio.Reader holds first, then straight from the socket, no more than
// asked for. A data stream reads its frame and chunk headers through it, so
// that the chunk's bytes are still in the socket for readSomeV to put in
// place (read through the bufio.Reader, a 256 KiB fill took a chunk's bytes
// with the header, to be copied out again).
type exactReader struct{ c *conn }

// Read implements io.Reader.
func (r exactReader) Read(p []byte) (int, error) {
	if r.c.r.Buffered() > 0 {
		return r.c.r.Read(p)
	}
	return r.c.c.Read(p)
}

// readFullV fills the slices of iov, in order, from the stream: readSomeV
// (with ahead, the next frame's headers read ahead) and, between its
// turns, waitReadable, as a data stream reads a large buffered chunk.
// Read through the bufio.Reader, such a chunk took its first read(2)
// straight into its buffer and every later one through the reader's own
// 256 KiB buffer (a fill that also took the chunks behind it), all copied
// out again on the stream's goroutine: most of a copy's bytes once more.
// On this project's 2-CPU VM, 1000 x 8 KiB over TCP with CRC32C went
// 0.45-0.49 -> 0.54-0.56 of raw TCP in a 3-round A/B (2026-12-06;
// docs/performance.md: suggestive, not settled). One reader at a time.
// Errors: readSomeV's and waitReadable's.
func (c *conn) readFullV(iov [][]byte, ahead bool) error {
	var want, done int64
	for _, p := range iov {
		want += int64(len(p))
	}
	defer func() { clear(c.readIOV) }()
	for {
		// What is left of iov, rebuilt each turn: readSomeV may have
		// advanced the slices it was given.
		rest := c.readIOV[:0]
		skip := done
		for _, p := range iov {
			if skip >= int64(len(p)) {
				skip -= int64(len(p))
				continue
			}
			rest = append(rest, p[skip:])
			skip = 0
		}
		c.readIOV = rest
		n, err := c.readSomeV(rest, ahead)
		if done += n; err != nil || done == want {
			return err
		}
		if err := c.waitReadable(); err != nil {
			return err
		}
	}
}

// readSomeV reads into the slices of iov, in order, what the connection
// has now, without waiting: what its reader holds first, then straight
// from the socket with one non-blocking readv(2), so that a range list's
// chunk lands in its spans without passing through the reader's buffer (an
// 8 KiB span cost a memmove from there). n is the bytes read into iov.
// With ahead, a readv that fills iov also takes up to readAhead bytes past
// it when the socket has them, kept in the connection (closingConn.pre)
// for its next read: a data stream's next frame and chunk headers come
// with the chunk, not by two more read(2)s. A connection that is not a
// socket (tests) reads all of iov through the reader, waiting. Errors: the
// connection's, io.ErrUnexpectedEOF.
func (c *conn) readSomeV(iov [][]byte, ahead bool) (n int64, err error) {
	for len(iov) > 0 && (c.r.Buffered() > 0 || len(c.c.pre) > 0) {
		k, _ := exactReader{c}.Read(iov[0]) // from the reader, then pre: no syscall
		n += int64(k)
		if iov[0] = iov[0][k:]; len(iov[0]) == 0 {
			iov = iov[1:]
		}
	}
	for len(iov) > 0 && len(iov[0]) == 0 {
		iov = iov[1:]
	}
	if len(iov) == 0 {
		return n, nil
	}
	sc, err := c.c.SyscallConn()
	if err != nil {
		for _, p := range iov {
			k, err := io.ReadFull(c.r, p)
			if n += int64(k); err != nil {
				return n, err
			}
		}
		return n, nil
	}
	iov = iov[:min(len(iov), 1024)] // IOV_MAX: the rest in the next call
	want := int64(0)
	for _, p := range iov {
		want += int64(len(p))
	}
	if ahead && len(iov) < 1024 {
		// The bytes ahead ride behind iov, in the connection's own
		// array (appending to iov could write into the caller's past
		// its length). pre is empty here (served above), and so is the
		// reader's buffer: nothing read earlier can come after them.
		c.iovAhead = append(append(c.iovAhead[:0], iov...), c.c.preBuf[:])
		iov = c.iovAhead
		defer clear(c.iovAhead)
	}
	var got int
	var rerr error
	err = sc.Read(func(fd uintptr) bool {
		got, rerr = unix.Readv(int(fd), iov)
		switch {
		case rerr == unix.EAGAIN || rerr == unix.EINTR:
			got, rerr = 0, nil
		case rerr == nil && got == 0:
			rerr = io.ErrUnexpectedEOF
		}
		return true // never wait here: the caller waits (waitReadable), holding nothing
	})
	if err != nil {
		return n, err
	}
	if int64(got) > want {
		c.c.pre = c.c.preBuf[:int64(got)-want]
		got = int(want)
	}
	return n + int64(got), rerr
}

// waitReadable waits until the connection has bytes to read (or its end,
// or an error): what its reader or pre hold, else the socket, polled for
// up to its spin and then waited for in the runtime's poller. It honours
// the read deadline. A caller that reads in pieces (readSomeV) waits here
// between them holding nothing: a chunk's destination tensor is not held
// while its peer is slow to send the rest. Errors: the connection's.
func (c *conn) waitReadable() error {
	if c.r.Buffered() > 0 || len(c.c.pre) > 0 {
		return nil
	}
	sc, err := c.c.SyscallConn()
	if err != nil {
		_, err := c.r.Peek(1)
		return err
	}
	var b [1]byte
	return spinRead(sc, c.c.spinFor(), func(fd int) bool {
		_, _, err := unix.Recvfrom(fd, b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return err != unix.EAGAIN && err != unix.EINTR
	})
}

func (c *conn) flush() error {
	c.c.SetWriteDeadline(time.Now().Add(c.timeout))
	return c.w.Flush()
}

// sendJSON sends v as a JSON message (encodeMsg: a request's or reply's
// descriptors as a table after it).
func (c *conn) sendJSON(typ byte, v any) error {
	if err := c.send(typ, c.encode(v)); err != nil {
		return err
	}
	return c.flush()
}

// encode is encodeMsg(v) in the connection's buffer, valid until its next
// encode (writes on a connection are one at a time: its protocol's turns).
func (c *conn) encode(v any) []byte {
	c.enc = encodeMsg(c.enc[:0], v)
	b := c.enc
	if cap(c.enc) > maxKeptEnc {
		c.enc = nil // a rare huge message's buffer is not kept for the idle pool
	}
	return b
}

// maxKeptEnc is the largest encode buffer a connection keeps, in bytes: a
// 1000-descriptor request's (25 KB) and a 10,000-descriptor one's.
const maxKeptEnc = 256 << 10

// recv reads the next frame that is not a keepalive; each frame, keepalives
// included, must come within the timeout.
func (c *conn) recv() (byte, []byte, error) {
	return c.recvArmed(func() { c.c.SetReadDeadline(time.Now().Add(c.timeout)) })
}

// recvArmed is recv with each frame's read deadline left to arm, which runs
// before every read: a push's reply waits without one while its data still
// goes out (awaitReply).
func (c *conn) recvArmed(arm func()) (byte, []byte, error) {
	max := c.max
	if max == 0 {
		max = maxHandshakeFrame
	}
	for {
		arm()
		typ, p, err := readFrame(c.r, c.buf, max)
		if err == nil && cap(p) > cap(c.buf) {
			c.buf = p[:0]
		}
		// After a keepalive the next frame may be a second away: wait for
		// it asleep; after anything else, spinning (closingConn.idle).
		c.c.idle.Store(err == nil && typ == frameKeepalive)
		if err == nil && typ == frameKeepalive {
			if f := c.onBeat.Load(); f != nil {
				(*f)()
			}
			var m progressMsg
			if c.progress != nil && len(p) > 0 && json.Unmarshal(p, &m) == nil {
				c.progress(m.BytesDone)
			}
			continue
		}
		return typ, p, err
	}
}

// recvJSON reads a frame of type want into v; an error frame becomes *Error.
func (c *conn) recvJSON(want byte, v any) error {
	return c.recvJSONArmed(want, v, func() { c.c.SetReadDeadline(time.Now().Add(c.timeout)) })
}

// recvJSONArmed is recvJSON with the read deadlines left to arm
// (recvArmed).
func (c *conn) recvJSONArmed(want byte, v any, arm func()) error {
	typ, p, err := c.recvArmed(arm)
	if err != nil {
		return netErr(err)
	}
	if typ == frameError {
		return wireToError(c.peer, p)
	}
	if typ != want {
		return fmt.Errorf("%s: frame type %d, want %d: %w", c.peer, typ, want, ErrFrame)
	}
	if v != nil {
		if err := decodeMsg(p, v); err != nil {
			return fmt.Errorf("%s: %v: %w", c.peer, err, ErrFrame)
		}
	}
	return nil
}

func (c *conn) sendError(err error) {
	we := wireError{Errno: errnoName(Errno(err)), Message: err.Error()}
	var te *Error
	if errors.As(err, &te) {
		we.Copied, we.Recheck = te.Copied, te.recheck
	}
	c.sendJSON(frameError, we)
}

// whileSilent runs fn, sending keepalive frames every third of the timeout
// until it returns, so the peer does not time out on work that is long but
// alive (preparing or committing a tree of thousands of tensors).
func (c *conn) whileSilent(fn func() error) error { return c.whileCopying(nil, fn) }

// progressEvery is how often the receiving node of an IPC put tells the
// sender how far it is (a keepalive with a progressMsg).
const progressEvery = 100 * time.Millisecond

// whileCopying is whileSilent for an IPC put: with rec, the keepalives
// carry rec's bytes done and go out every progressEvery. fn runs on the
// caller's goroutine and the keepalives come from the process's one
// keepalive loop (beats), so a short fn (a small copy) costs no goroutine
// and no timer; no keepalive is written after it returns.
func (c *conn) whileCopying(rec *Record, fn func() error) error {
	every := max(c.timeout/3, time.Millisecond)
	if rec != nil {
		every = min(every, progressEvery)
	}
	b := &beat{c: c, rec: rec, every: every, next: time.Now().Add(every)}
	beats.add(b)
	err := fn()
	b.mu.Lock()
	b.stopped = true
	b.mu.Unlock()
	beats.remove(b)
	return err
}

// beats is the process's keepalive loop (beater).
var beats beater

// beater writes the keepalives of the calls running under whileCopying:
// one goroutine for the process, which sleeps until the earliest keepalive
// due (at most beatTick) while any call is running, and ends after
// beatIdle without one. Why not a timer per call: a timer due before every
// other one in the process wakes the runtime's network poller (a futex
// wake of another thread) when it is armed, and every copy armed one
// (twice for a TCP put): 14 % of an IPC put's receiving CPU on the 2-core
// VM (2026-12-06). A call that comes due before the loop would wake (a
// timeout below 3*beatTick) wakes it. A keepalive is written on its own
// goroutine, so that a peer that stops reading delays no other call's.
type beater struct {
	mu      sync.Mutex
	calls   map[*beat]struct{}
	running bool
	until   time.Time     // when the loop wakes next
	wake    chan struct{} // a call due before until wakes it
}

// beatTick is the longest the keepalive loop sleeps; beatIdle how long it
// stays without calls before it ends (a burst of copies keeps it).
const (
	beatTick = 50 * time.Millisecond
	beatIdle = 2 * time.Second
)

// beat is one call under whileCopying.
type beat struct {
	c     *conn
	rec   *Record // nil: a keepalive without progress
	every time.Duration
	next  time.Time // when its next keepalive is due (beater.mu)

	mu      sync.Mutex // held while its keepalive is written
	stopped bool       // fn has returned: no keepalive any more
}

func (k *beater) add(b *beat) {
	k.mu.Lock()
	if k.calls == nil {
		k.calls = map[*beat]struct{}{}
	}
	k.calls[b] = struct{}{}
	var hurry chan struct{} // the running loop's, read under mu: a new loop makes its own
	if !k.running {
		k.running, k.wake = true, make(chan struct{}, 1)
		k.until = time.Now().Add(beatTick)
		if b.next.Before(k.until) {
			k.until = b.next
		}
		go k.loop(k.wake, k.until)
	} else if b.next.Before(k.until) {
		hurry = k.wake
	}
	k.mu.Unlock()
	if hurry != nil {
		select {
		case hurry <- struct{}{}:
		default:
		}
	}
}

func (k *beater) remove(b *beat) {
	k.mu.Lock()
	delete(k.calls, b)
	k.mu.Unlock()
}

// loop sends the keepalives that are due, each at its time, until it has
// been without calls for beatIdle; it first wakes at until.
func (k *beater) loop(wake <-chan struct{}, until time.Time) {
	t := time.NewTimer(time.Until(until))
	defer t.Stop()
	var idleSince time.Time
	var due []*beat
	for {
		select {
		case <-t.C:
		case <-wake:
			t.Stop()
		}
		now := time.Now()
		next := now.Add(beatTick)
		k.mu.Lock()
		if len(k.calls) == 0 {
			if idleSince.IsZero() {
				idleSince = now
			} else if now.Sub(idleSince) >= beatIdle {
				k.running = false
				k.mu.Unlock()
				return
			}
		} else {
			idleSince = time.Time{}
		}
		for b := range k.calls {
			if !now.Before(b.next) {
				b.next = now.Add(b.every)
				due = append(due, b)
			}
			if b.next.Before(next) {
				next = b.next
			}
		}
		k.until = next
		k.mu.Unlock()
		for _, b := range due {
			go b.send()
		}
		clear(due)
		due = due[:0]
		t.Reset(time.Until(next))
	}
}

// send writes b's keepalive, unless its call has returned.
func (b *beat) send() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return
	}
	var p []byte
	if b.rec != nil {
		p = marshal(progressMsg{BytesDone: b.rec.BytesDone.Load()})
	}
	err := b.c.send(frameKeepalive, p)
	if err == nil {
		err = b.c.flush()
	}
	if err == nil {
		var hung bool
		if hung, err = hungUp(b.c); hung && err == nil {
			err = io.EOF
		}
	}
	if err != nil {
		b.c.lost.CompareAndSwap(nil, &Error{Errno: syscall.ECONNRESET, Msg: fmt.Sprintf("peer %s went away during the copy: %v", b.c.peer, err)})
	}
}
