package transfer

import (
	"log/slog"
	"time"
	"unsafe"
)

// RMA is a one-sided transport for the bytes between hosts, as this node
// offers it: transfer/ucx's Context in a build with UCX (build tag ucx),
// nil otherwise (Config.RMA). Its worker address travels in the handshake
// (hello and challenge carry it), and each side makes an endpoint to a
// peer that offers one, once per peer run (DESIGN.md, "Between hosts";
// issue 17). A copy to or from a peer of another host moves its bytes on
// the endpoint when it carries copies (Service.carries), the destination
// reading (rmaPush, rmaPull); names, authentication,
// commit and notification stay on the tensorfs connection.
type RMA interface {
	// Address is this node's worker address (opaque bytes).
	Address() []byte
	// Connect makes an endpoint to the worker at a peer's address.
	Connect(addr []byte) (RMAEndpoint, error)
	// Map maps n bytes of this process's host memory at addr (a staging
	// buffer) for peers' one-sided access, returning its packed rkey;
	// unmap it before the memory goes.
	Map(addr uintptr, n int) (rkey []byte, unmap func() error, err error)
}

// RMAEndpoint is this node's endpoint to one peer's worker.
type RMAEndpoint interface {
	// Transports names what the endpoint's lanes run on ("tcp/lo",
	// "rc_mlx5/mlx5_0:1"), for the log and stats.
	Transports() []string
	// OneSided reports whether the endpoint reaches the peer's
	// registered memory by itself (an RMA lane on RDMA verbs, say).
	// Without one, UCX emulates puts and gets with messages the peer's
	// worker serves: slower than tensorfs's streams, stuck behind a dead
	// shared-memory peer, and fatal to a target whose initiator dies
	// mid-transfer (see transfer/ucx's Endpoint.OneSided).
	OneSided() bool
	// DetectsPeerFailure reports whether the endpoint fails its
	// operations when the peer dies (UCX's peer error handling). Without
	// it a dead peer's operations hang (emulated) or abort this process
	// (UCX 1.19's cma: a process_vm_readv of a dead pid is fatal on such
	// an endpoint). Copies move their bytes on an endpoint only when it is
	// one-sided and detects peer failure, unless Config.RMAAnyEndpoint.
	DetectsPeerFailure() bool
	// Close closes it, flushing first unless force, waiting at most until
	// deadline.
	Close(force bool, deadline time.Time) error
	// Unpack unpacks a peer region's packed rkey for this endpoint: n
	// bytes at base in the peer, which every descriptor is checked
	// against.
	Unpack(rkey []byte, base uint64, n int) (RMAKey, error)
}

// RMAKey is a peer region's rkey unpacked on an endpoint. tensorfs uses
// one only in a transfer whose source offers that region (the same packed
// bytes, address and length) and holds it frozen for the transfer, so a
// key is never used on memory that can go, and a region's free needs no
// revocation round; unpacked keys are kept for the next transfer
// (rmaKeys) and destroyed when evicted or with their endpoint.
type RMAKey interface {
	// Get reads each descriptor's N bytes at Off of the region into
	// Local, completing all of them (one flush) before it returns nil; it
	// gives up at deadline or when stop closes (the peer's tensorfs
	// connection broke), after which operations may still be in flight
	// until the endpoint is closed.
	Get(descs []RMADesc, deadline time.Time, stop <-chan struct{}) error
	// Destroy releases the key.
	Destroy() error
}

// RMADesc is one one-sided operation: N bytes between Local, an address of
// this process's host memory, and byte Off of the peer's region.
type RMADesc struct {
	Local uintptr
	Off   uint64
	N     uint64
}

// RMAMemory is a tensor's host memory as a one-sided transport sees it
// (a source's, which the peer reads; a destination's, which the gets land
// in), and as the TCP sender sends a source from it (ChecksumNone):
// Mem, the tensor's bytes in this process, its region's packed rkey (nil:
// not mapped for the transport, so a peer cannot reach it), and Off, where
// a descriptor without spans has its byte 0 in the tensor (a source's
// range, an in-place destination's Off; 0 for a whole tensor).
type RMAMemory struct {
	Mem  []byte
	Rkey []byte
	Off  int64
}

// addr is where Mem starts in this process.
func (m RMAMemory) addr() uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(m.Mem))) }

// RMASource is implemented by a Source whose tensor is host memory the
// transport may read while the source is open (namespace's frozen
// sources). ok false: GPU memory, staged through host memory.
type RMASource interface {
	RMAMemory() (m RMAMemory, ok bool)
}

// RMADest is implemented by a Dest whose descriptor i's tensor is host
// memory the transport's gets may write until Commit or Abort. ok false:
// GPU memory, or a range that overlaps another of the copy (posted gets
// keep no order among themselves, the lines' order decides what an
// overlap holds): staged through host memory and written with WriteAt.
type RMADest interface {
	RMAMemory(i int) (m RMAMemory, ok bool)
}

// rmaCloseWait bounds an endpoint's close: a flush to a dead peer over a
// transport that cannot tell (shared memory) ends there.
const rmaCloseWait = time.Second

// rmaPeer is the endpoint to one peer, for the run (instance) whose
// address made it.
type rmaPeer struct {
	instance   string
	ep         RMAEndpoint
	transports []string
	oneSided   bool // ep.OneSided
	guarded    bool // ep.DetectsPeerFailure
	// keys are the peer's rkeys unpacked on ep, for the next transfers
	// (rmaKeys); the endpoint's close destroys them.
	keys rmaKeys
}

// rmaAddress is what this node's handshake messages carry: its RMA
// worker address, or nil.
func (s *Service) rmaAddress() []byte {
	if s.cfg.RMA == nil {
		return nil
	}
	return s.cfg.RMA.Address()
}

// noteRMA makes the endpoint to peer (whose run is instance) from the
// worker address its authenticated handshake carried, unless one to that
// run exists; an endpoint to an earlier run of the peer (it restarted,
// with UCX or without) is closed first. A peer that offers none, or this
// node without RMA, makes nothing. An endpoint that cannot be made is
// logged, not an error: the TCP streams carry the copies either way.
func (s *Service) noteRMA(peer, instance string, addr []byte) {
	if s.cfg.RMA == nil || peer == "" {
		return
	}
	s.rmaMu.Lock()
	defer s.rmaMu.Unlock()
	if s.rmaClosed {
		return
	}
	old := s.rma[peer]
	if old != nil && old.instance == instance {
		return
	}
	if old != nil {
		// The peer restarted: its old worker is gone. Closed aside, so
		// that a close waiting on it holds up no handshake.
		delete(s.rma, peer)
		go old.ep.Close(true, time.Now().Add(rmaCloseWait))
	}
	if len(addr) == 0 {
		return
	}
	ep, err := s.cfg.RMA.Connect(addr)
	if err != nil {
		slog.Warn("ucx: no endpoint to the peer; copies with it stay on TCP", "peer", peer, "err", err)
		return
	}
	p := &rmaPeer{instance: instance, ep: ep, transports: ep.Transports(), oneSided: ep.OneSided(), guarded: ep.DetectsPeerFailure()}
	if s.rma == nil {
		s.rma = map[string]*rmaPeer{}
	}
	s.rma[peer] = p
	switch why := p.unguarded(); {
	case why == "":
		slog.Info("ucx: endpoint to the peer", "peer", peer, "transports", p.transports)
	case s.carries(p):
		slog.Warn("ucx: endpoint to the peer "+why+"; copies with it move their bytes on it all the same (--ucx-any-endpoint: for trying the UCX path without RDMA)", "peer", peer, "transports", p.transports)
	default:
		slog.Warn("ucx: endpoint to the peer "+why+"; copies with it stay on TCP", "peer", peer, "transports", p.transports)
	}
}

// unguarded is why copies should not move their bytes on the endpoint,
// for the log and errors: "" when it is one-sided and detects a dead peer.
func (p *rmaPeer) unguarded() string {
	switch {
	case !p.oneSided:
		return "is not one-sided (UCX would emulate puts and gets with messages the peer serves: slower than tensorfs's streams, stuck behind a dead shared-memory peer, and UCX aborts a target whose initiator dies mid-transfer)"
	case !p.guarded:
		return "cannot detect a dead peer (shared memory: UCX then aborts this daemon when a peer dies mid-copy)"
	}
	return ""
}

// carries reports whether copies move their bytes on p (nil: none): it
// is one-sided and detects a dead peer, or Config.RMAAnyEndpoint takes
// any endpoint.
func (s *Service) carries(p *rmaPeer) bool {
	return p != nil && (p.unguarded() == "" || s.cfg.RMAAnyEndpoint)
}

// rmaEndpoints is the endpoint to each peer that has one, for stats.
func (s *Service) rmaEndpoints() map[string]*rmaPeer {
	s.rmaMu.Lock()
	defer s.rmaMu.Unlock()
	out := make(map[string]*rmaPeer, len(s.rma))
	for name, p := range s.rma {
		out[name] = p
	}
	return out
}

// closeRMA closes every endpoint and unmaps the kept staging buffers
// (Service.Close).
func (s *Service) closeRMA() {
	s.rmaMu.Lock()
	defer s.rmaMu.Unlock()
	s.rmaClosed = true
	for name, p := range s.rma {
		p.ep.Close(true, time.Now().Add(rmaCloseWait))
		delete(s.rma, name)
	}
	s.stages.close()
}
