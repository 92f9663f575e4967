// Package transfer is tensorfs's peer service: it authenticates peers with a
// shared secret, and moves tensors between nodes over TCP streams in
// pipelined chunks, each checked by its checksum (XXH3 or CRC32C). It knows
// nothing of FUSE: the node's own tensors are reached through the Local
// interface, which the fs package implements.
//
// Every frame is read through one reader (frame.go), which checks a frame's
// length and type against the one table of frame types, so that a new
// message is added in one place and every exchange agrees on what is
// valid; the messages' payloads live by family in wire_handshake.go,
// wire_copy.go and wire_lease.go. The data of a transfer moves on streams
// that are types: sender (send_stream.go) and recvStream
// (receive_stream.go).
package transfer

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Local is the node's own tensor namespace, as the peer service needs it;
// the fs package implements it. Paths are mount-relative and already checked
// (absolute, no "..").
type Local interface {
	// Get opens the tensors at path for reading: a file gives one source with
	// Rel "" (with r set, its bytes r names), a directory every tensor below
	// it (isDir true). Errors carry an errno (ENOENT; EINVAL for a range
	// outside the tensor, or on a directory).
	Get(path string, r Range) (srcs []Source, isDir bool, err error)
	// Put prepares the destination of a copy of the given descriptors at
	// path: a file (isDir false, one Meta with Rel "") or a directory tree;
	// whole tensors get temporaries, in-place ranges are checked (the
	// tensor exists and holds the range; EINVAL, ENOENT) and pinned.
	Put(path string, isDir bool, metas []Meta) (Dest, error)
}

// Source is one tensor being read for a copy; it stays readable (pinned)
// until Close, even if unlinked meanwhile.
type Source interface {
	Meta() Meta
	ReadAt(p []byte, off int64) (int, error)
	Close()
}

// Dest receives the descriptors of one copy: WriteAt(i, p, off) writes
// bytes [off, off+len(p)) of descriptor i (into a whole tensor's temporary,
// or in place at the descriptor's Off). Commit puts the whole tensors in
// place (each atomically), after every in-place byte has landed, and
// returns how many descriptors it placed; Abort removes the temporaries and
// leaves the destination as it was (in-place bytes written so far stay,
// like an RDMA WRITE's).
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
	// Peers maps peer names to HOST:PORT (--peer); they win over Resolver.
	Peers map[string]string
	// Resolver, when set, finds the peers Peers does not name (package
	// cluster's etcd view); nil: Peers only.
	Resolver Resolver
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
	// IdleTimeout is how long an authenticated connection to a peer, idle
	// after a copy, is kept for the next one (default DefaultIdleTimeout),
	// alive by keepalives: a copy then pays no dial or handshake. At most
	// maxIdle per peer.
	IdleTimeout time.Duration
	// Streams is how many parallel TCP streams a large transfer asks for
	// (default DefaultStreams, at most MaxStreams; 1: one connection). The
	// receiving side of a put and the sending side of a get decide: one
	// stream for transfers under a few chunks per stream (streamsFor).
	Streams int
	// Spin is how long a read on a peer connection that finds nothing
	// polls the socket before the goroutine sleeps in the runtime's poller:
	// a copy's wait for its reply, a daemon's for the next request of a
	// burst, a data stream's for its next chunk. Each sleep costs the copy
	// a wake-up (8-16 µs each way on the H200 host, measured by execution
	// traces of the 4 KiB in-place copy) and a cold start after it; the
	// spin costs a core for at most Spin per wait, and none after a
	// keepalive (an idle connection sleeps). 0 (the default here):
	// never; the daemon's --spin default is DefaultSpin on a host of at
	// least 4 CPUs, 0 on smaller ones, where a spinning reader would take
	// the core its peer needs.
	Spin time.Duration
	// Checksum is the check of every chunk of this node's TCP copies,
	// which the receiver makes (a mismatch fails the copy with EIO): XXH3
	// (the zero value) with a peer that takes it, else CRC32C, or none
	// when both ends say none; each end tells the other in the handshake
	// and both apply checksumWith. Without one, TCP's own checksum guards
	// the bytes, as it does for raw TCP and for UCX's and the other
	// engines' TCP transports, and a source in host memory is sent
	// straight from its mapping, with no copy into a send buffer (a sum
	// needs that copy: the sum and the bytes sent must be one snapshot,
	// and a process that maps the source may write it meanwhile). The
	// two passes over every byte cost a CPU-starved host most: on 2 cores
	// a 512 MiB copy went from 0.36-0.52 of raw TCP with CRC32C to
	// 0.69-1.06 without, on an H100 host an 8 MiB one from 0.63-0.70 to
	// 0.81-0.96 (2026-12-06, docs/performance.md); XXH3 costs a third of
	// CRC32C's pass. The daemon's --checksum.
	Checksum Checksum
	// CopyDone, when set, is called at the end of every successful copy
	// this node tracks (Service.Track), with its path ("local", "ipc",
	// "tcp"), its mode ("whole", "in_place", "mixed"), its bytes and how
	// long it took on this node: what the counters cannot say, a latency
	// distribution (the daemon's metrics observe it). It runs on the
	// copy's goroutine, before the setxattr returns: it must be cheap.
	CopyDone func(path, mode string, bytes int64, took time.Duration)
	// RMA, when set, is this node's one-sided transport (transfer/ucx in
	// a build with UCX): its address goes in the handshake, an endpoint is
	// made to each peer that offers one (see RMA), and copies with such a
	// peer of another host move their bytes on it (path "ucx") when it
	// carries copies (one-sided and detecting a dead peer, or any with
	// RMAAnyEndpoint), with the others on TCP.
	RMA RMA
	// RMARequired (--transport ucx) makes a copy with a peer of another
	// host that offers no RMA endpoint that carries copies an error
	// (EPROTONOSUPPORT) instead of a TCP copy.
	RMARequired bool
	// RMAAnyEndpoint (--ucx-any-endpoint) makes copies move their bytes
	// on any RMA endpoint: also one that is not one-sided (UCX's
	// emulation of puts and gets with messages) or cannot detect a dead
	// peer (RMAEndpoint.OneSided and DetectsPeerFailure say what each
	// costs): for trying and testing the UCX path on machines without
	// RDMA.
	RMAAnyEndpoint bool
}

// Service is a node's peer service: a listener for peers and the client side
// of copies to and from them.
type Service struct {
	cfg   Config
	local Local
	ln    net.Listener
	// lnLocal is the abstract unix socket localName that peers of this
	// host connect to (nil when it could not be made: they use TCP).
	lnLocal   net.Listener
	localName string
	ns        string // this process's namespaces (namespaces)
	wg        sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool

	// met is what the last handshake with each peer said, by name
	// (notePeer): stats shows it for the peers --peer names, of which
	// nothing else is known.
	metMu sync.Mutex
	met   map[string]peerMet
	// locals are the unix sockets of peers of this host (learnLocal), by
	// name; badLocal the last socket that failed for each (forgetLocal).
	locals   map[string]localPeer
	badLocal map[string]string

	// rma holds the RMA endpoint to each peer that offered an address, by
	// name (noteRMA); rmaClosed: Close has closed them all.
	rmaMu     sync.Mutex
	rma       map[string]*rmaPeer
	rmaClosed bool
	// stages keeps the staging buffers of one-sided copies for the next.
	stages stagePool
	// idle holds authenticated connections to each peer that finished a
	// copy in step, for the next copy: a dial and handshake cost more than a
	// small copy itself.
	idle    map[string][]idleConn
	reaping bool
	// pending holds the transfers that wait for extra streams to join, by
	// token; pendingAdded is closed (and replaced) at each registration
	// and at each end, for the early joins that came before their put
	// (serveJoin). ended holds the tokens of the transfers that ended
	// within the last timeout, oldest first in endedOrder: an early join
	// that comes after its put ended (a put that failed before its
	// streams joined) is refused at once, where it waited out the timeout
	// for a put that would never register (and Close waited for it).
	pending      map[string]*pending
	pendingAdded chan struct{}
	ended        map[string]struct{}
	endedOrder   []endedToken

	// instance identifies this run of the node (random, fresh at New).
	instance string
	imports  *importCache
	// binds are the bindings this node holds for one-sided writes into
	// peers' tensors (bind.go); bindIDs the last binding id it granted.
	binds   bindCache
	bindIDs atomic.Uint64
	// chans are the lease channels, by the peer's instance id.
	chanMu      sync.Mutex
	chans       map[string]*leaseChan
	chansClosed bool       // closeChans ran: no new channels
	dialMu      sync.Mutex // one lease-channel dial at a time

	// waiting counts the served connections waiting for their next
	// request (a peer's idle connections, seen from this side).
	waiting atomic.Int64
	// copyLog spaces the log lines of successful in-place copies.
	copyLog copyLog

	nextID atomic.Uint64 // the last record id given
	// The completed copies' counters, by path (PathLocal, ...) and mode
	// (ModeWhole, ...): their number and bytes; and their descriptors.
	// Stats and CopyCounts both read these, so the stats document and the
	// metrics never disagree.
	copies      [numPaths][3]atomic.Int64
	bytes       [numPaths][3]atomic.Int64
	descriptors atomic.Int64
	// rechecks counts the copies this node ran again from buffers after
	// a chunk failed its sum where its bytes lie (request.Recheck).
	rechecks atomic.Int64
	active   atomic.Int64
	recentMu sync.Mutex
	recent   []*Record
}

// ErrConfig: a configuration the service refuses to start with.
var ErrConfig = errors.New("invalid peer configuration")

// New returns a service; call Start to listen. Errors: ErrConfig for a
// non-loopback Listen without a secret, a secret under 16 bytes, or a
// Checksum that is none of the three.
func New(cfg Config, local Local) (*Service, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.ChunkSize <= 0 {
		cfg.ChunkSize = 1 << 20
	}
	cfg.ChunkSize = min(cfg.ChunkSize, 4<<20)
	if cfg.Streams <= 0 {
		cfg.Streams = DefaultStreams
	}
	cfg.Streams = min(cfg.Streams, MaxStreams)
	if cfg.Checksum > ChecksumNone {
		return nil, fmt.Errorf("checksum %v: want ChecksumXXH3, ChecksumCRC32C or ChecksumNone: %w", cfg.Checksum, ErrConfig)
	}
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
	return &Service{cfg: cfg, local: local, conns: map[net.Conn]struct{}{}, instance: fmt.Sprintf("%x", nonce()[:16]), imports: newImportCache(), chans: map[string]*leaseChan{}, ns: namespaces()}, nil
}

// Start listens on cfg.Listen (if set) and serves peers until Close. With
// it, it also listens on an abstract unix socket named by the instance
// (localPrefix and 32 hex digits), which peers of the same host connect to
// instead (Service.dial): a request and its reply there cost a few
// microseconds less than over loopback TCP, whose whole stack both ends
// run (a 24 KB descriptor table and a short reply: 13.3-13.9 against
// 17.5-19.3 µs on the 2-vCPU VM, Go, p50 of 20,000). An abstract name
// needs no file to clean up and is seen only in this network namespace,
// as loopback is; peers authenticate there with the secret as over TCP.
// When it cannot be made, peers of this host use TCP (logged).
func (s *Service) Start() error {
	if s.cfg.Listen == "" {
		return nil
	}
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", s.cfg.Listen, err)
	}
	s.ln = ln
	// The socket's name is set before any handshake can offer it.
	name := localPrefix + s.instance
	if s.ns == "" {
		slog.Info("no unix socket for peers of this host (/proc/self/ns does not name this process's namespaces); they connect over TCP")
	} else if !localSupported() {
		slog.Info("no unix socket for peers of this host (the kernel gives no SO_PEERPIDFD, Linux 6.5); they connect over TCP")
	} else if lu, err := net.Listen("unix", name); err != nil {
		slog.Warn("no unix socket for peers of this host; they connect over TCP", "socket", name, "err", err)
	} else {
		s.lnLocal, s.localName = lu, name
		s.accept(lu, name)
	}
	s.accept(ln, s.cfg.Listen)
	return nil
}

// localPrefix starts the name of a node's abstract unix socket (Start).
const localPrefix = "@tensorfs-"

// accept serves the connections of ln (named so in the log) until it is
// closed.
func (s *Service) accept(ln net.Listener, name string) {
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
				slog.Warn("accept failed; retrying", "listen", name, "err", err)
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
}

// Name is this node's name.
func (s *Service) Name() string { return s.cfg.Name }

// HostID is this node's host identity.
func (s *Service) HostID() string { return s.cfg.HostID }

// Instance is the id of this run of the node (32 hex digits, fresh at New):
// peers key what they imported from it by this id, so a restarted node's
// new id retires the old imports.
func (s *Service) Instance() string { return s.instance }

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
	if s.lnLocal != nil {
		s.lnLocal.Close()
	}
	s.closeChans()
	s.wg.Wait()
	s.imports.closeAll()
	s.closeRMA()
	return nil
}

// importKinds lists the IPC handle kinds this node opens.
func (s *Service) importKinds() []string {
	kinds := []string{"memfd"}
	for k := range s.cfg.Importers {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	return kinds
}
