package transfer

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"log"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Local is the node's own tensor namespace, as the peer service needs it;
// the fs package implements it. Paths are mount-relative and already checked
// (absolute, no "..").
type Local interface {
	// Get opens the tensors at path for reading: a file gives one source with
	// Rel "", a directory every tensor below it (isDir true). Errors carry an
	// errno (ENOENT, ...).
	Get(path string) (srcs []Source, isDir bool, err error)
	// Put prepares the destination of a copy of the given tensors at path: a
	// file (isDir false, one Meta with Rel "") or a directory tree.
	Put(path string, isDir bool, metas []Meta) (Dest, error)
}

// Source is one tensor being read for a copy; it stays readable (pinned)
// until Close, even if unlinked meanwhile.
type Source interface {
	Meta() Meta
	ReadAt(p []byte, off int64) (int, error)
	Close()
}

// Dest receives the tensors of one copy under temporary names; Commit puts
// them in place (each atomically) and returns how many it placed, Abort
// removes everything and leaves the destination as it was.
type Dest interface {
	WriteAt(i int, p []byte, off int64) error
	Commit() (int, error)
	Abort()
}

// Config configures a node's peer service.
type Config struct {
	// Name is this node's name, used in peer paths (NAME:/path).
	Name string
	// HostID is this node's host identity (default: the kernel's boot id);
	// peers with the same HostID are on the same host.
	HostID string
	// Listen is HOST:PORT to accept peers on; "" accepts none.
	Listen string
	// Peers maps peer names to HOST:PORT.
	Peers map[string]string
	// Secret is the shared secret for peer authentication (HMAC challenge-
	// response); nil means none, allowed only on loopback.
	Secret []byte
	// Timeout bounds every network wait (dial, handshake, each frame): a
	// dead peer fails a copy within it. Default 10 s.
	Timeout time.Duration
	// ChunkSize is the bytes per data frame (default 1 MiB, at most 4 MiB).
	ChunkSize int
	// Importers open IPC handles of kinds beyond "memfd" (which the package
	// opens itself), by kind: "cuda" for "cuda:" + 128 hex digits. Peers
	// learn the kinds at the handshake and offer only those.
	Importers map[string]func(handle string) (Mapping, error)
	// ImportFile, when set, turns an exported memfd that the package opened
	// and checked (a tensorfs memfd of another daemon) into a Mapping, e.g.
	// a mapping of it when it is sealed against shrinking, so that a copy
	// is one memmove into the destination. nil: pread from the file.
	ImportFile func(f *os.File) (Mapping, error)
	// Streams is how many parallel TCP streams a large transfer asks for
	// (default DefaultStreams, at most MaxStreams; 1: one connection). The
	// receiving side of a put and the sending side of a get decide: one
	// stream for transfers under a few chunks per stream (streamsFor).
	Streams int
}

// Service is a node's peer service: a listener for peers and the client side
// of copies to and from them.
type Service struct {
	cfg   Config
	local Local
	ln    net.Listener
	wg    sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	// idle holds authenticated connections to each peer that finished a
	// copy in step, for the next copy: a dial and handshake cost more than a
	// small copy itself.
	idle    map[string][]idleConn
	reaping bool
	// pending holds the transfers that wait for extra streams to join, by
	// token.
	pending map[string]*pending

	// instance identifies this run of the node (random, fresh at New).
	instance string
	imports  *importCache
	// chans are the lease channels, by the peer's instance id.
	chanMu      sync.Mutex
	chans       map[string]*leaseChan
	chansClosed bool       // closeChans ran: no new channels
	dialMu      sync.Mutex // one lease-channel dial at a time

	nextID   atomic.Uint64   // the last record id given
	copies   [3]atomic.Int64 // local, ipc, tcp
	active   atomic.Int64
	recentMu sync.Mutex
	recent   []*Record
}

// Path kinds, the index into copies.
const (
	PathLocal = iota
	PathIPC
	PathTCP
)

// Record is one transfer, for stats: progress while it runs, the outcome
// after.
type Record struct {
	// ID numbers the records of a service from 1 (never reused).
	ID             uint64
	Src, Dst, Path string
	// pid is the process that asked for the copy, 0 when unknown or not
	// yet known (WithCallerLookup).
	pid atomic.Int64
	// Streams is how many TCP streams carry the data.
	Streams    atomic.Int64
	BytesDone  atomic.Int64
	BytesTotal atomic.Int64
	Tensors    atomic.Int64
	err        atomic.Value // string
	// phases: on the receiving side, the microseconds spent preparing the
	// destination, moving the bytes and committing (RecordReport.PhaseUS).
	phases   [3]atomic.Int64
	received atomic.Bool // a phase was timed: this node received
	start    time.Time
	took     atomic.Int64 // µs from Track to end; 0 while it runs
}

// phase indexes Record's phase times (RecordReport.PhaseUS).
type phase int

const (
	phasePrepare phase = iota // the destination's temporaries allocated and registered
	phaseData                 // the bytes moved (received, or copied from an import)
	phaseCommit               // the temporaries renamed into place
)

// timed runs fn and adds its duration to phase p of rec (nil: just runs).
func (rec *Record) timed(p phase, fn func() error) error {
	t := time.Now()
	err := fn()
	if rec != nil {
		rec.phases[p].Add(time.Since(t).Microseconds())
		rec.received.Store(true)
	}
	return err
}

// ErrConfig: a configuration the service refuses to start with.
var ErrConfig = errors.New("invalid peer configuration")

// New returns a service; call Start to listen. Errors: ErrConfig for a
// non-loopback Listen without a secret, or a secret under 16 bytes.
func New(cfg Config, local Local) (*Service, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.ChunkSize <= 0 {
		cfg.ChunkSize = 1 << 20
	}
	cfg.ChunkSize = min(cfg.ChunkSize, 4<<20)
	if cfg.Streams <= 0 {
		cfg.Streams = DefaultStreams
	}
	cfg.Streams = min(cfg.Streams, MaxStreams)
	if cfg.Secret != nil && len(cfg.Secret) < 16 {
		return nil, fmt.Errorf("secret of %d bytes, want at least 16: %w", len(cfg.Secret), ErrConfig)
	}
	if cfg.Listen != "" && cfg.Secret == nil {
		host, _, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("--listen %q: %v: %w", cfg.Listen, err, ErrConfig)
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return nil, fmt.Errorf("--listen %s is not a loopback address and no --secret-file is given: %w", cfg.Listen, ErrConfig)
		}
	}
	peers := make(map[string]string, len(cfg.Peers))
	for k, v := range cfg.Peers {
		peers[k] = v
	}
	cfg.Peers = peers
	return &Service{cfg: cfg, local: local, conns: map[net.Conn]struct{}{}, instance: fmt.Sprintf("%x", nonce()[:16]), imports: newImportCache(), chans: map[string]*leaseChan{}}, nil
}

// Start listens on cfg.Listen (if set) and serves peers until Close.
func (s *Service) Start() error {
	if s.cfg.Listen == "" {
		return nil
	}
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", s.cfg.Listen, err)
	}
	s.ln = ln
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				// EMFILE and the like: keep serving once they pass.
				log.Printf("accept on %s: %v", s.cfg.Listen, err)
				time.Sleep(50 * time.Millisecond)
				continue
			}
			if !s.track(c) {
				c.Close()
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer s.untrack(c)
				s.serve(c)
			}()
		}
	}()
	return nil
}

// Name is this node's name.
func (s *Service) Name() string { return s.cfg.Name }

// HostID is this node's host identity.
func (s *Service) HostID() string { return s.cfg.HostID }

// Addr is the listening address (useful with port 0), or nil.
func (s *Service) Addr() net.Addr {
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

func (s *Service) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Service) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.Close()
}

// Close stops listening, drops every connection (aborting their copies) and
// waits for the handlers to finish.
func (s *Service) Close() error {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	for _, l := range s.idle {
		for _, ic := range l {
			ic.c.c.Close()
		}
	}
	s.idle = nil
	s.mu.Unlock()
	if s.ln != nil {
		s.ln.Close()
	}
	s.closeChans()
	s.wg.Wait()
	s.imports.closeAll()
	return nil
}

type idleConn struct {
	c     *conn
	since time.Time
}

// maxIdle is how many idle connections are kept per peer (enough for the
// streams of two transfers), and idleFor how long at most (also bounded by half the timeout, after which the peer drops
// a silent connection); idle ones are closed then, so an idle node holds no
// sockets.
const (
	maxIdle = 2 * MaxStreams
	idleFor = 2 * time.Second
)

func (s *Service) idleLimit() time.Duration { return min(idleFor, s.cfg.Timeout/2) }

// reapIdle closes idle connections past idleLimit, and runs again while
// any remain.
func (s *Service) reapIdle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	left := 0
	for peer, l := range s.idle {
		kept := l[:0]
		for _, ic := range l {
			if time.Since(ic.since) >= s.idleLimit() {
				ic.c.c.Close()
			} else {
				kept = append(kept, ic)
			}
		}
		s.idle[peer] = kept
		left += len(kept)
	}
	s.reaping = left > 0
	if s.reaping {
		time.AfterFunc(s.idleLimit()/2, s.reapIdle)
	}
}

// conn returns an authenticated connection to peer: an idle one that is
// still open, or a new one (see dial for the errors).
func (s *Service) conn(ctx context.Context, peer string) (*conn, error) {
	for {
		s.mu.Lock()
		l := s.idle[peer]
		if len(l) == 0 {
			s.mu.Unlock()
			return s.dial(ctx, peer)
		}
		ic := l[len(l)-1]
		s.idle[peer] = l[:len(l)-1]
		s.mu.Unlock()
		// The peer drops a connection silent for its timeout; give up on one
		// idle for half of ours, and on one that the peer has closed (a read
		// that does not wait finds EOF rather than a timeout).
		if time.Since(ic.since) < s.idleLimit() && alive(ic.c) {
			return ic.c, nil
		}
		ic.c.c.Close()
	}
}

// alive reports whether c has neither data nor an end waiting, with a
// non-blocking peek at the socket (a Go read with a past deadline would not
// look at all).
func alive(c *conn) bool {
	if c.r.Buffered() > 0 {
		return false
	}
	raw, err := c.c.SyscallConn()
	if err != nil {
		return false
	}
	idle := false
	var b [1]byte
	raw.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		idle = err == syscall.EAGAIN && n <= 0
		return true // never wait for readiness
	})
	return idle
}

// done ends a copy's use of c: kept for the next copy to the same peer when
// the copy succeeded and its context did not close c (open), else closed.
func (s *Service) done(peer string, c *conn, open bool, err error) {
	if err != nil || !open || c.c.closed.Load() {
		c.c.Close()
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.idle[peer]) >= maxIdle {
		c.c.Close()
		return
	}
	if s.idle == nil {
		s.idle = map[string][]idleConn{}
	}
	s.idle[peer] = append(s.idle[peer], idleConn{c: c, since: time.Now()})
	if !s.reaping {
		s.reaping = true
		time.AfterFunc(s.idleLimit()/2, s.reapIdle)
	}
}

// closingConn is a net.Conn that remembers being closed, so that a
// connection closed to stop a transfer's goroutines is never pooled for the
// next copy (which would then pay a dial and a handshake after finding it
// dead).
type closingConn struct {
	net.Conn
	closed atomic.Bool
}

func (c *closingConn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

// SyscallConn exposes the socket for alive's non-blocking peek.
func (c *closingConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}

func newConn(nc net.Conn, timeout time.Duration, peer string) *conn {
	cc := &closingConn{Conn: nc}
	return &conn{c: cc, r: bufio.NewReaderSize(cc, 256<<10), w: bufio.NewWriterSize(cc, 256<<10), timeout: timeout, peer: peer}
}

// conn is one authenticated connection with deadline handling.
type conn struct {
	c       *closingConn
	r       *bufio.Reader
	w       *bufio.Writer
	timeout time.Duration
	buf     []byte
	peer    string
	hostID  string
	max     uint32 // largest frame accepted now
	// instance and imports: the peer's, from the handshake.
	instance string
	imports  []string
	// ownerPID is the peer's process, once a memfd handle naming it was
	// checked against the connection (checkOwner).
	ownerPID int
	// progress, when set, gets the bytes_done of keepalives that carry a
	// progressMsg (an IPC put's receiver reporting to its sender).
	progress func(bytesDone int64)
}

func (c *conn) send(typ byte, payload []byte) error {
	c.c.SetWriteDeadline(time.Now().Add(c.timeout))
	if err := writeFrame(c.w, typ, payload); err != nil {
		return err
	}
	return nil
}

func (c *conn) flush() error {
	c.c.SetWriteDeadline(time.Now().Add(c.timeout))
	return c.w.Flush()
}

func (c *conn) sendJSON(typ byte, v any) error {
	if err := c.send(typ, marshal(v)); err != nil {
		return err
	}
	return c.flush()
}

// recv reads the next frame that is not a keepalive; each frame, keepalives
// included, must come within the timeout.
func (c *conn) recv() (byte, []byte, error) {
	max := c.max
	if max == 0 {
		max = maxHandshakeFrame
	}
	for {
		c.c.SetReadDeadline(time.Now().Add(c.timeout))
		typ, p, err := readFrame(c.r, c.buf, max)
		if err == nil && cap(p) > cap(c.buf) {
			c.buf = p[:0]
		}
		if err == nil && typ == frameKeepalive {
			var m progressMsg
			if c.progress != nil && len(p) > 0 && json.Unmarshal(p, &m) == nil {
				c.progress(m.BytesDone)
			}
			continue
		}
		return typ, p, err
	}
}

// whileSilent runs fn, sending keepalive frames every third of the timeout
// until it returns, so the peer does not time out on work that is long but
// alive (preparing or committing a tree of thousands of tensors).
func (c *conn) whileSilent(fn func() error) error { return c.whileCopying(nil, fn) }

// progressEvery is how often the receiving node of an IPC put tells the
// sender how far it is (a keepalive with a progressMsg).
const progressEvery = 100 * time.Millisecond

// whileCopying is whileSilent for an IPC put: with rec, the keepalives
// carry rec's bytes done and go out every progressEvery.
func (c *conn) whileCopying(rec *Record, fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	every := c.timeout / 3
	if rec != nil {
		every = min(every, progressEvery)
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			var p []byte
			if rec != nil {
				p = marshal(progressMsg{BytesDone: rec.BytesDone.Load()})
			}
			if c.send(frameKeepalive, p) == nil {
				c.flush()
			}
		}
	}
}

// recvJSON reads a frame of type want into v; an error frame becomes *Error.
func (c *conn) recvJSON(want byte, v any) error {
	typ, p, err := c.recv()
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
		if err := json.Unmarshal(p, v); err != nil {
			return fmt.Errorf("%s: %v: %w", c.peer, err, ErrFrame)
		}
	}
	return nil
}

// wireToError decodes an error frame; an errno name this node does not know
// is EIO.
func wireToError(peer string, p []byte) error {
	var we wireError
	if json.Unmarshal(p, &we) != nil {
		return &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: malformed error frame", peer)}
	}
	errno, ok := errnoNames[we.Errno]
	if !ok {
		errno = syscall.EIO
	}
	return &Error{Errno: errno, Msg: fmt.Sprintf("%s: %s", peer, we.Message), Copied: we.Copied}
}

func (c *conn) sendError(err error) {
	we := wireError{Errno: errnoName(Errno(err)), Message: err.Error()}
	var te *Error
	if errors.As(err, &te) {
		we.Copied = te.Copied
	}
	c.sendJSON(frameError, we)
}

// netErr turns network failures into errnos a copy can report: a deadline
// is ETIMEDOUT, a closed connection EIO.
func netErr(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return &Error{Errno: syscall.ETIMEDOUT, Msg: err.Error(), broken: true}
	}
	if errors.Is(err, ErrFrame) {
		return &Error{Errno: syscall.EPROTO, Msg: err.Error(), broken: true}
	}
	var te *Error
	if errors.As(err, &te) {
		return err
	}
	var errno syscall.Errno
	if errors.As(err, &errno) && (errno == syscall.ECONNREFUSED || errno == syscall.EHOSTUNREACH || errno == syscall.ENETUNREACH || errno == syscall.ETIMEDOUT) {
		return &Error{Errno: errno, Msg: err.Error(), broken: true}
	}
	// A broken connection (EPIPE, ECONNRESET, EOF) mid-copy is an I/O error.
	return &Error{Errno: syscall.EIO, Msg: err.Error(), broken: true}
}

func nonce() []byte {
	b := make([]byte, 32)
	rand.Read(b)
	return b
}

// dial connects and authenticates to a named peer. Errors: ENOENT for an
// unknown peer, the dial's errno (ECONNREFUSED, EHOSTUNREACH, ETIMEDOUT),
// EACCES for a refused authentication, EPROTO for a version mismatch.
func (s *Service) dial(ctx context.Context, peer string) (*conn, error) {
	addr, ok := s.cfg.Peers[peer]
	if !ok {
		known := make([]string, 0, len(s.cfg.Peers))
		for n := range s.cfg.Peers {
			known = append(known, n)
		}
		sort.Strings(known)
		return nil, &Error{Errno: syscall.ENOENT, Msg: fmt.Sprintf("unknown peer %q (known peers: %s; add one with --peer NAME=HOST:PORT)", peer, strings.Join(known, ", "))}
	}
	d := net.Dialer{Timeout: s.cfg.Timeout}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return nil, &Error{Errno: errno, Msg: fmt.Sprintf("peer %s at %s: %v", peer, addr, err)}
		}
		return nil, netErr(err)
	}
	c := newConn(nc, s.cfg.Timeout, peer)
	cn := nonce()
	if err := c.sendJSON(frameHello, hello{Version: ProtocolVersion, Name: s.cfg.Name, HostID: s.cfg.HostID, Nonce: cn, Instance: s.instance, Imports: s.importKinds()}); err != nil {
		nc.Close()
		return nil, netErr(err)
	}
	var ch challenge
	if err := c.recvJSON(frameChallenge, &ch); err != nil {
		nc.Close()
		return nil, err
	}
	if ch.Version != ProtocolVersion {
		nc.Close()
		return nil, &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("protocol version mismatch: peer %s speaks %d, node %s speaks %d", peer, ch.Version, s.cfg.Name, ProtocolVersion)}
	}
	if !hmac.Equal(ch.Proof, proof(s.cfg.Secret, "server", cn, ch.Nonce, s.cfg.Name, ch.Name)) {
		nc.Close()
		return nil, &Error{Errno: syscall.EACCES, Msg: fmt.Sprintf("peer %s at %s failed to prove the shared secret", peer, addr)}
	}
	if err := c.sendJSON(frameAuth, authMsg{Proof: proof(s.cfg.Secret, "client", cn, ch.Nonce, s.cfg.Name, ch.Name)}); err != nil {
		nc.Close()
		return nil, netErr(err)
	}
	if err := c.recvJSON(frameOK, nil); err != nil {
		nc.Close()
		return nil, err
	}
	c.hostID = ch.HostID
	c.instance, c.imports = ch.Instance, ch.Imports
	c.max = MaxFrame
	return c, nil
}

// handshake authenticates an accepted connection.
func (s *Service) handshake(nc net.Conn) (*conn, error) {
	c := newConn(nc, s.cfg.Timeout, nc.RemoteAddr().String())
	typ, p, err := c.recv()
	if err != nil {
		return nil, err
	}
	var h hello
	if typ != frameHello || json.Unmarshal(p, &h) != nil {
		return nil, fmt.Errorf("%s: no hello: %w", c.peer, ErrFrame)
	}
	if h.Version != ProtocolVersion {
		err := &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("protocol version mismatch: peer %s speaks %d, node %s speaks %d", h.Name, h.Version, s.cfg.Name, ProtocolVersion)}
		c.sendError(err)
		return nil, err
	}
	c.peer = h.Name
	sn := nonce()
	if err := c.sendJSON(frameChallenge, challenge{Version: ProtocolVersion, Name: s.cfg.Name, HostID: s.cfg.HostID, Nonce: sn, Proof: proof(s.cfg.Secret, "server", h.Nonce, sn, h.Name, s.cfg.Name), Instance: s.instance, Imports: s.importKinds()}); err != nil {
		return nil, err
	}
	var a authMsg
	if err := c.recvJSON(frameAuth, &a); err != nil {
		return nil, err
	}
	if !hmac.Equal(a.Proof, proof(s.cfg.Secret, "client", h.Nonce, sn, h.Name, s.cfg.Name)) {
		err := &Error{Errno: syscall.EACCES, Msg: fmt.Sprintf("peer %s (%s) failed to prove the shared secret", h.Name, nc.RemoteAddr())}
		c.sendError(err)
		return nil, err
	}
	if err := c.sendJSON(frameOK, reply{}); err != nil {
		return nil, err
	}
	c.hostID = h.HostID
	c.instance, c.imports = h.Instance, h.Imports
	c.max = MaxFrame
	return c, nil
}

// serve runs one accepted connection: the handshake, then requests.
func (s *Service) serve(nc net.Conn) {
	c, err := s.handshake(nc)
	if err != nil {
		log.Printf("peer %s: %v", nc.RemoteAddr(), err)
		return
	}
	for {
		var req request
		typ, p, err := c.recv()
		if err != nil {
			return // the peer hung up, or went silent past the timeout
		}
		if typ != frameRequest || json.Unmarshal(p, &req) != nil {
			c.sendError(&Error{Errno: syscall.EPROTO, Msg: "expected a request"})
			return
		}
		var rerr error
		if p, err := CleanPath(req.Path); err != nil {
			c.sendError(err)
			continue
		} else {
			req.Path = p
		}
		switch req.Op {
		case "put":
			rerr = s.servePut(c, req)
		case "get":
			rerr = s.serveGet(c, req)
		case "lease":
			s.serveLease(c)
			return
		case "join":
			if !s.serveJoin(c, req) {
				return
			}
		default:
			rerr = &Error{Errno: syscall.EINVAL, Msg: fmt.Sprintf("unknown op %q", req.Op)}
			c.sendError(rerr)
		}
		if rerr != nil {
			log.Printf("peer %s: %s %s: %v", c.peer, req.Op, req.Path, rerr)
			var te *Error
			if !errors.As(rerr, &te) || te.Errno == syscall.EPROTO || te.Errno == syscall.ETIMEDOUT || te.Errno == syscall.EIO {
				return // the stream is in an unknown state: drop the connection
			}
		}
	}
}

// crcTable is CRC32C (Castagnoli), checked per chunk so corruption is an EIO,
// not bad data.
var crcTable = crc32.MakeTable(crc32.Castagnoli)

// importKinds lists the IPC handle kinds this node opens.
func (s *Service) importKinds() []string {
	kinds := []string{"memfd"}
	for k := range s.cfg.Importers {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	return kinds
}
