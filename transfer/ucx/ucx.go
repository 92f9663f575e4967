//go:build ucx

package ucx

/*
#cgo LDFLAGS: -lucp -lucs
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>
#include <ucs/config/global_opts.h>

// The wrappers exist because cgo cannot take UCX's macros (UCS_PTR_*) and
// its static inline ucp_init, and so that a Go call is one C call.

static ucs_status_t tfs_init(ucp_context_h *ctx) {
	ucp_config_t *config;
	ucs_status_t st = ucp_config_read(NULL, NULL, &config);
	if (st != UCS_OK) {
		return st;
	}
	ucp_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_PARAM_FIELD_FEATURES;
	p.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
	st = ucp_init(&p, config, ctx);
	ucp_config_release(config);
	return st;
}

static ucs_status_t tfs_worker(ucp_context_h ctx, ucp_worker_h *w) {
	ucp_worker_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
	p.thread_mode = UCS_THREAD_MODE_MULTI;
	return ucp_worker_create(ctx, &p, w);
}

// tfs_ep_failed is an endpoint's error callback: the failure itself
// reaches the operations in flight (their status) and the next ones;
// installing it is what makes UCX report it there instead of logging
// that nobody handles it.
static void tfs_ep_failed(void *arg, ucp_ep_h ep, ucs_status_t status) {}

// tfs_ep_quiet is tfs_ep with UCX's own log held to fatal errors: the
// first attempt of Connect, with peer error handling, fails over shared
// memory (which has none) with an ERROR line on stdout that is no error
// here (Connect then makes the endpoint without it).
static ucs_status_t tfs_ep(ucp_worker_h w, const void *addr, int peer_errors, ucp_ep_h *ep);
static ucs_status_t tfs_ep_quiet(ucp_worker_h w, const void *addr, ucp_ep_h *ep) {
	ucs_log_level_t was = ucs_global_opts.log_component.log_level;
	if (was > UCS_LOG_LEVEL_FATAL) {
		ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_FATAL;
	}
	ucs_status_t st = tfs_ep(w, addr, 1, ep);
	ucs_global_opts.log_component.log_level = was;
	return st;
}

static ucs_status_t tfs_ep(ucp_worker_h w, const void *addr, int peer_errors, ucp_ep_h *ep) {
	ucp_ep_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
	p.address = (const ucp_address_t *)addr;
	if (peer_errors) {
		p.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
		p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
		p.err_handler.cb = tfs_ep_failed;
		p.err_handler.arg = NULL;
	}
	return ucp_ep_create(w, &p, ep);
}

static ucs_status_t tfs_mem_map(ucp_context_h ctx, uintptr_t addr, size_t n, ucp_mem_h *memh) {
	ucp_mem_map_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
	p.address = (void *)addr;
	p.length = n;
	return ucp_mem_map(ctx, &p, memh);
}

// tfs_status is a ucs_status_ptr_t's meaning: UCS_OK (done at once), an
// error, or UCS_INPROGRESS (a request to wait for).
static ucs_status_t tfs_status(ucs_status_ptr_t r) {
	if (r == NULL) {
		return UCS_OK;
	}
	if (UCS_PTR_IS_ERR(r)) {
		return UCS_PTR_STATUS(r);
	}
	return UCS_INPROGRESS;
}

// tfs_post posts n puts (get == 0) or gets of the descriptors in d
// (local address, remote address, length: three uint64 each) under one
// rkey; requests still in flight are released to UCX at once, for the
// flush after them completes them all. It returns how many were posted
// and the first error.
static ucs_status_t tfs_post(ucp_ep_h ep, int get, const uint64_t *d, size_t n, ucp_rkey_h rkey, size_t *posted) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	for (size_t i = 0; i < n; i++) {
		void *local = (void *)(uintptr_t)d[3 * i];
		uint64_t remote = d[3 * i + 1];
		size_t len = (size_t)d[3 * i + 2];
		ucs_status_ptr_t r = get ? ucp_get_nbx(ep, local, len, remote, rkey, &p)
		                         : ucp_put_nbx(ep, local, len, remote, rkey, &p);
		ucs_status_t st = tfs_status(r);
		if (st != UCS_OK && st != UCS_INPROGRESS) {
			*posted = i;
			return st;
		}
		if (st == UCS_INPROGRESS) {
			ucp_request_free(r);
		}
	}
	*posted = n;
	return UCS_OK;
}

static ucs_status_ptr_t tfs_flush(ucp_ep_h ep) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	return ucp_ep_flush_nbx(ep, &p);
}

static ucs_status_ptr_t tfs_close(ucp_ep_h ep, int force) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
	return ucp_ep_close_nbx(ep, &p);
}

// tfs_ep_info is ucp_ep_print_info's text (the lanes and the transports
// UCX chose), malloc'd; the caller frees it.
static char *tfs_ep_info(ucp_ep_h ep) {
	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);
	if (f == NULL) {
		return NULL;
	}
	ucp_ep_print_info(ep, f);
	fclose(f);
	return buf;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Error is a UCX status other than UCS_OK: Op is the call that returned
// it, Status its ucs_status_t (negative), Msg ucs_status_string's text.
type Error struct {
	Op     string
	Status int
	Msg    string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s (UCX status %d)", e.Op, e.Msg, e.Status) }

// ErrTimeout is what a wait for a request returns when its deadline
// passes first (the endpoint is then unusable: close it with force).
var ErrTimeout = errors.New("ucx: request timed out")

// ErrStopped is what a wait for a request returns when its caller's stop
// channel closes first (its peer is gone, by another sign than UCX's): the
// endpoint is then unusable, as after ErrTimeout.
var ErrStopped = errors.New("ucx: request stopped")

// ErrRange is a descriptor outside its region: the remote range is not
// inside the rkey's [Base, Base+Len), or a length is negative. Nothing of
// the list is posted.
var ErrRange = errors.New("ucx: descriptor outside its region")

// ErrClosed is a call on a closed Context, Endpoint or RemoteKey.
var ErrClosed = errors.New("ucx: closed")

func check(op string, st C.ucs_status_t) error {
	if st == C.UCS_OK {
		return nil
	}
	return &Error{Op: op, Status: int(st), Msg: C.GoString(C.ucs_status_string(st))}
}

// Context is one UCP context and its worker, the unit a daemon holds: RMA
// and wake-up features, the worker in UCS_THREAD_MODE_MULTI so that any
// goroutine may post and progress, and one goroutine progressing it
// whenever its event fd says something arrived (the target side of some
// transports, TCP's among them, needs the target to progress; when idle
// that goroutine sleeps in poll(2), it does not spin). UCX reads its
// configuration (UCX_TLS, UCX_NET_DEVICES, ...) from the environment when
// the context is opened.
type Context struct {
	ctx  C.ucp_context_h
	w    C.ucp_worker_h
	efd  int
	stop int // an eventfd that ends the progress goroutine
	addr []byte
	done chan struct{}
	spin time.Duration

	// life is held for reading by an Unmap and for writing by Close, so
	// that a region's last release racing the daemon's close never
	// unmaps from a context being cleaned up.
	life   sync.RWMutex
	closed atomic.Bool
}

// Config is a Context's settings; the zero value is valid.
type Config struct {
	// Spin is how long the progress goroutine keeps progressing the
	// worker after the last thing it did, before it arms the event fd and
	// sleeps (0: at once). A target serving a peer's descriptor list over
	// a transport that emulates RMA with messages (TCP) otherwise sleeps
	// and wakes between the list's messages; tensorfs's peer connections
	// spin for the same reason (--spin).
	Spin time.Duration
}

// Open makes a daemon's context and worker and starts its progress
// goroutine. Errors: *Error (no transport usable, say).
func Open(cfg Config) (*Context, error) {
	c := &Context{done: make(chan struct{}), spin: cfg.Spin}
	if err := check("ucp_init", C.tfs_init(&c.ctx)); err != nil {
		return nil, err
	}
	if err := check("ucp_worker_create", C.tfs_worker(c.ctx, &c.w)); err != nil {
		C.ucp_cleanup(c.ctx)
		return nil, err
	}
	var efd C.int
	if err := check("ucp_worker_get_efd", C.ucp_worker_get_efd(c.w, &efd)); err != nil {
		c.release()
		return nil, err
	}
	c.efd = int(efd)
	var addr *C.ucp_address_t
	var n C.size_t
	if err := check("ucp_worker_get_address", C.ucp_worker_get_address(c.w, &addr, &n)); err != nil {
		c.release()
		return nil, err
	}
	c.addr = C.GoBytes(unsafe.Pointer(addr), C.int(n))
	C.ucp_worker_release_address(c.w, addr)
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		c.release()
		return nil, fmt.Errorf("ucx: eventfd: %w", err)
	}
	c.stop = stop
	go c.progressLoop()
	return c, nil
}

// release frees the worker and the context.
func (c *Context) release() {
	C.ucp_worker_destroy(c.w)
	C.ucp_cleanup(c.ctx)
}

// progressLoop progresses the worker until nothing is pending, arms its
// event fd and sleeps in poll(2) until it (or stop) fires.
func (c *Context) progressLoop() {
	defer close(c.done)
	fds := []unix.PollFd{{Fd: int32(c.efd), Events: unix.POLLIN}, {Fd: int32(c.stop), Events: unix.POLLIN}}
	awake := time.Now() // since the loop last slept in poll
	// throttle: past busyFor without sleeping, each round first sleeps
	// pause: an endpoint to a dead shared-memory peer with operations
	// still queued to it (UCX 1.13 cannot fail it) keeps the worker busy
	// or its event fd ready for ever, and spun a core (a peer killed
	// mid-copy). busyFor is long and pause short because a busy worker is
	// more often a live one serving a peer's emulated puts and gets
	// (--ucx-any-endpoint): doubling pauses of up to 64 ms past 20 ms starved
	// those, and a 1000-descriptor list timed out on a loaded machine.
	// tensorfs's own operations progress the worker in their waits.
	throttle := func() bool {
		if time.Since(awake) <= busyFor {
			return true
		}
		// The stop fd only: the worker's may be ready for ever.
		stopFD := fds[1:]
		unix.Poll(stopFD, pauseMs)
		return stopFD[0].Revents == 0
	}
	for !c.stopped() {
		if !throttle() {
			return
		}
		// Bounded by the stop check: a peer's steady traffic must not
		// keep Close waiting.
		for !c.stopped() && C.ucp_worker_progress(c.w) != 0 {
			if !throttle() {
				return
			}
		}
		if c.spin > 0 {
			// Progress on while something happens, until spin has
			// passed with nothing.
			for last := time.Now(); time.Since(last) < c.spin; {
				if C.ucp_worker_progress(c.w) != 0 {
					last = time.Now()
				}
				if c.stopped() {
					return
				}
			}
		}
		switch st := C.ucp_worker_arm(c.w); st {
		case C.UCS_OK:
		case C.UCS_ERR_BUSY:
			continue // something arrived meanwhile: progress again
		default:
			// Not expected with FEATURE_WAKEUP; poll briefly rather
			// than spin or stop serving the peers' operations (the
			// loop's condition still sees a stop).
			time.Sleep(time.Millisecond)
			continue
		}
		slept := time.Now()
		if _, err := unix.Poll(fds, -1); err != nil && !errors.Is(err, unix.EINTR) {
			time.Sleep(time.Millisecond)
		}
		// A poll that returns at once is no sleep: the worker's event
		// fd stays ready for ever when a dead shared-memory peer's
		// endpoint keeps it so (found spinning a core in poll and
		// eventfd reads after a peer was killed mid-get).
		if time.Since(slept) >= time.Millisecond {
			awake = time.Now()
		}
		if fds[1].Revents != 0 {
			return
		}
	}
}

// busyFor is how long the progress goroutine progresses without sleeping
// before it throttles itself, sleeping pauseMs ms before each round
// (progressLoop): a worker kept busy for ever then costs about 1% of a
// core.
const (
	busyFor = 500 * time.Millisecond
	pauseMs = 1
)

// stopped reports whether Close has asked the progress goroutine to end.
func (c *Context) stopped() bool { return c.closed.Load() }

// Address is the worker's UCP address, for a peer's Connect: opaque bytes
// (a few hundred, depending on the transports), sent on the tensorfs
// connection.
func (c *Context) Address() []byte { return slices.Clone(c.addr) }

// Close stops the progress goroutine and frees the worker and the
// context. Endpoints must be closed first; regions still mapped then are
// left to ucp_cleanup (which releases them through UCX's registration
// cache, warning once each, and leaks them without it: harmless when the
// process is exiting) and their Unmap does nothing. Calls after it (Map,
// Connect) are ErrClosed.
func (c *Context) Close() error {
	if c.closed.Swap(true) {
		return ErrClosed
	}
	one := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	unix.Write(c.stop, one)
	<-c.done
	unix.Close(c.stop)
	c.life.Lock()
	defer c.life.Unlock()
	c.release()
	return nil
}

// wait progresses the worker until request r (a ucs_status_ptr_t from a
// non-blocking call) completes or deadline passes, then frees it; once
// stop (nil: never) is closed, it waits stopDrain more at most, and its
// end is ErrStopped however it ends.
// Errors: *Error for the request's failure, ErrTimeout, ErrStopped.
func (c *Context) wait(op string, r C.ucs_status_ptr_t, deadline time.Time, stop <-chan struct{}) error {
	switch st := C.tfs_status(r); st {
	case C.UCS_OK:
		return nil
	case C.UCS_INPROGRESS:
	default:
		return check(op, st)
	}
	defer C.ucp_request_free(unsafe.Pointer(r))
	stopped := false
	// end is the wait's error: ErrStopped once stopped, however it ended.
	end := func(err error) error {
		if stopped {
			return fmt.Errorf("%s: %w", op, ErrStopped)
		}
		return err
	}
	for i := 0; ; i++ {
		if st := C.ucp_request_check_status(unsafe.Pointer(r)); st != C.UCS_INPROGRESS {
			return end(check(op, st))
		}
		C.ucp_worker_progress(c.w)
		if i%64 == 63 {
			if time.Now().After(deadline) {
				return end(fmt.Errorf("%s: %w", op, ErrTimeout))
			}
			if !stopped {
				select {
				case <-stop:
					// The caller's peer is gone, but the operation
					// may still move bytes between live buffers (a
					// stopped 256 MiB get ran on for a second after
					// its wait returned): drained for up to
					// stopDrain, so that in the common case no get
					// lands in memory its owner has reused.
					stopped = true
					if d := time.Now().Add(stopDrain); d.Before(deadline) {
						deadline = d
					}
				default:
				}
			}
			runtime.Gosched()
		}
	}
}

// stopDrain is how long a stopped request is still waited for.
const stopDrain = 2 * time.Second

// Region is memory of this process mapped for remote access
// (ucp_mem_map): registered with the network where the transport needs
// it, and described by a packed rkey that a peer unpacks to reach it.
// Its lifetime is the memory region's: map at create, unmap at the last
// release, before the memory goes.
type Region struct {
	c    *Context
	memh C.ucp_mem_h
	base uintptr
	n    int
	rkey []byte

	mu     sync.Mutex
	closed bool
}

// Map maps n bytes at base (host memory of this process, not Go's heap:
// a tensor's memfd mapping) and packs its rkey. Errors: ErrRange (n not
// positive, or the range wraps), ErrClosed (the context is), *Error.
func (c *Context) Map(base uintptr, n int) (*Region, error) {
	if n <= 0 || uint64(base)+uint64(n) < uint64(base) {
		return nil, fmt.Errorf("ucx: map %d bytes at %#x: %w", n, base, ErrRange)
	}
	c.life.RLock()
	defer c.life.RUnlock()
	if c.closed.Load() {
		return nil, ErrClosed
	}
	r := &Region{c: c, base: base, n: n}
	if err := check("ucp_mem_map", C.tfs_mem_map(c.ctx, C.uintptr_t(base), C.size_t(n), &r.memh)); err != nil {
		return nil, err
	}
	var buf unsafe.Pointer
	var size C.size_t
	if err := check("ucp_rkey_pack", C.ucp_rkey_pack(c.ctx, r.memh, &buf, &size)); err != nil {
		C.ucp_mem_unmap(c.ctx, r.memh)
		return nil, err
	}
	r.rkey = C.GoBytes(buf, C.int(size))
	C.ucp_rkey_buffer_release(buf)
	return r, nil
}

// Rkey is the region's packed remote key (opaque bytes, tens to hundreds
// depending on the transports), which a peer passes to Endpoint.Unpack.
func (r *Region) Rkey() []byte { return slices.Clone(r.rkey) }

// Base and Len are the region's address in this process and its bytes: a
// peer addresses the region's bytes as Base()+offset.
func (r *Region) Base() uint64 { return uint64(r.base) }

// Len is the region's length in bytes.
func (r *Region) Len() int { return r.n }

// Unmap ends the mapping (ucp_mem_unmap): a peer's later operation with
// the old rkey fails or, on transports that do not check (tcp, sm), must
// not happen; tensorfs's peers hold a region's rkey only during a
// transfer that holds the region pinned (transfer.RMAKey), so none is
// left when it is unmapped. Errors: ErrClosed (twice), *Error.
func (r *Region) Unmap() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	r.closed = true
	r.c.life.RLock()
	defer r.c.life.RUnlock()
	if r.c.closed.Load() {
		// The context went first (a daemon's last frees after its close):
		// ucp_cleanup has the mapping (see Context.Close).
		return nil
	}
	return check("ucp_mem_unmap", C.ucp_mem_unmap(r.c.ctx, r.memh))
}

// Endpoint is this worker's connection to a peer's worker (UCX makes and
// keeps whatever transport connections it needs), with peer error
// handling where its transports have it (DetectsPeerFailure; not shared
// memory): a dead peer then fails its operations instead of hanging them
// or aborting the process.
// Its methods and its keys' are safe for concurrent use; Close waits for
// the operations in progress.
type Endpoint struct {
	c  *Context
	ep C.ucp_ep_h
	// peerErrors: made with UCP_ERR_HANDLING_MODE_PEER. UCX 1.13's
	// shared-memory transports have no peer failure handler, so an
	// endpoint over them is made without it (DetectsPeerFailure).
	peerErrors bool

	// mu is read-held by every use of ep (posts, unpacks, queries) and
	// write-held by Close and Destroy: nothing uses a freed endpoint or
	// key. It guards closed and keys.
	mu     sync.RWMutex
	closed bool
	keys   map[*RemoteKey]struct{} // live, destroyed by Close at the latest
}

// Connect makes an endpoint to the worker at addr (a peer's
// Context.Address), with peer error handling, or without it when UCX
// answers UCS_ERR_UNREACHABLE (no transport to the peer can report its
// failure: shared memory; DetectsPeerFailure is then false). Errors:
// ErrClosed (the context is), *Error (an empty address, one that does not
// parse, no transport in common).
func (c *Context) Connect(addr []byte) (*Endpoint, error) {
	if len(addr) == 0 {
		return nil, &Error{Op: "ucp_ep_create", Status: int(C.UCS_ERR_INVALID_PARAM), Msg: "empty worker address"}
	}
	c.life.RLock()
	defer c.life.RUnlock()
	if c.closed.Load() {
		return nil, ErrClosed
	}
	ca := C.CBytes(addr)
	defer C.free(ca)
	e := &Endpoint{c: c, peerErrors: true, keys: map[*RemoteKey]struct{}{}}
	st := C.tfs_ep_quiet(c.w, ca, &e.ep)
	if st == C.UCS_ERR_UNREACHABLE {
		// No transport to the peer can report its failure (shared
		// memory): without peer error handling, then.
		e.peerErrors = false
		st = C.tfs_ep(c.w, ca, 0, &e.ep)
	}
	if err := check("ucp_ep_create", st); err != nil {
		return nil, err
	}
	return e, nil
}

// DetectsPeerFailure reports whether the endpoint fails its operations
// when the peer dies (UCP_ERR_HANDLING_MODE_PEER). Over shared memory it
// cannot (UCX 1.13 and 1.19: posix and sysv have no peer failure handler):
// with 1.13 an emulated put to a dead peer hangs, with 1.19 a cma get from
// one aborts the process. tensorfs learns of a dead peer from its own
// connection to it either way.
func (e *Endpoint) DetectsPeerFailure() bool { return e.peerErrors }

// use runs f with the endpoint (and its context) held open: ErrClosed
// when either is closed.
func (e *Endpoint) use(f func() error) error {
	e.mu.RLock()
	defer e.mu.RUnlock()
	e.c.life.RLock()
	defer e.c.life.RUnlock()
	if e.closed || e.c.closed.Load() {
		return ErrClosed
	}
	return f()
}

// lanePattern matches a lane of ucp_ep_print_info's text, "lane[0]:
// 0:tcp/lo.0 md[0] -> ...", capturing the local resource, which is
// "transport/device" and the path index UCX appends (".0").
var lanePattern = regexp.MustCompile(`lane\[\d+\]:\s+\d+:(\S+)`)

// pathIndex is the ".N" a lane's resource ends with.
var pathIndex = regexp.MustCompile(`\.\d+$`)

// Transports are the transports UCX chose for the endpoint's lanes, as
// "transport/device" names ("tcp/lo"; "posix/memory", "cma/memory"; an
// RDMA device such as "rc_mlx5/mlx5_0:1"), sorted, once each: for the log
// and stats. Nil for a closed endpoint.
func (e *Endpoint) Transports() []string {
	info := e.info()
	if info == "" {
		return nil
	}
	return parseLanes(info)
}

// info is ucp_ep_print_info's text for the endpoint, "" when closed.
func (e *Endpoint) info() string {
	var info string
	e.use(func() error {
		if s := C.tfs_ep_info(e.ep); s != nil {
			info = C.GoString(s)
			C.free(unsafe.Pointer(s))
		}
		return nil
	})
	return info
}

// OneSided reports whether the endpoint reaches the peer's registered
// memory (a tensor's memfd mapping, a staging buffer: memory UCX did not
// allocate) by itself, with no work from the peer's worker: a lane used
// for remote memory access (the lanes of ucp_ep_print_info's put[N] and
// get[N] lines, or one marked rma_bw) whose memory domain registers
// foreign memory (RDMA verbs, xpmem; cma in UCX releases that use it for
// RMA). Shared memory's posix and sysv lanes reach only segments UCX
// allocated itself (mm_md.c: no mem_reg, max_reg 0), and UCX 1.13 does
// not use cma for RMA (select.c wants put_short, put_bcopy and get_bcopy
// of an RMA lane; cma has only zcopy), so over UCX 1.13's "sm" as over
// "tcp" UCX emulates puts and gets with active messages that the target's
// worker serves and acknowledges (found: puts to a stopped peer never
// completed). The RMA lanes are judged by the put[N] and get[N] lines
// when UCX prints them (its original protocols, which use only those
// lanes for puts and gets: UCX 1.13, and later ones with
// UCX_PROTO_ENABLE=n), else by the rma_bw lanes (the newer protocols,
// UCX 1.19: their zcopy puts and gets run there). Such an emulation is
// slower than tensorfs's own paths, can read or write memory given back
// after the transfer gave up, keeps the worker busy for ever behind a
// dead shared-memory peer, and aborts a target whose initiator died
// mid-transfer (UCX 1.13.1 and master:
// ucp_put_handler -> ucp_rma_sw_send_cmpl -> ucp_request_try_send ->
// ucs_fatal "unexpected error: Endpoint timeout"): tensorfs moves bytes
// on it only when told to (transfer.Config.RMAAnyEndpoint,
// --ucx-any-endpoint). False for a closed endpoint.
func (e *Endpoint) OneSided() bool { return hasRMALane(e.info()) }

// laneLine matches a lane of ucp_ep_print_info's text: its index, the
// peer's memory domain component after "->" ("md[2]/posix/sysdev[255]",
// "addr[1].md[2]/posix", UCX 1.10's "md[2]/posix") and the rest of the
// line, which holds the usages (" rma_bw#0 am"; UCX 1.16 and later print
// " seg N" before them).
var laneLine = regexp.MustCompile(`(?m)lane\[(\d+)\]:.*->\s*(?:addr\[\d+\]\.)?md\[\d+\]/([^/\s]+)(?:/\S*)?(.*)$`)

// rmaProto matches the put and get protocol lines UCX 1.13 prints for
// each RMA lane ("#   put[1]: 0..<short>..(inf)"), capturing the lane.
var rmaProto = regexp.MustCompile(`(?m)^#\s+(?:put|get)\[(\d+)\]:`)

// rmaBW matches the rma_bw usage of a lane line's usages (or an "rma"
// usage, as some releases print it).
var rmaBW = regexp.MustCompile(`(^|\s)rma(_bw)?(#\d+)?(\s|$)`)

// allocOnly are the memory domain components whose RMA reaches only
// memory UCX allocated with them (shared memory segments), never a
// registered range of the peer's own memory.
var allocOnly = map[string]bool{"posix": true, "sysv": true}

// hasRMALane is OneSided's parse of ucp_ep_print_info's text: is there
// an RMA lane whose peer memory domain is not allocOnly? The RMA lanes
// are those of the put[N] and get[N] lines when there are any, else those
// with an rma_bw usage (see OneSided).
func hasRMALane(info string) bool {
	rma := map[string]bool{}
	for _, m := range rmaProto.FindAllStringSubmatch(info, -1) {
		rma[m[1]] = true
	}
	byProto := len(rma) > 0
	for _, m := range laneLine.FindAllStringSubmatch(info, -1) {
		isRMA := rma[m[1]]
		if !byProto {
			isRMA = rmaBW.MatchString(m[3])
		}
		if isRMA && !allocOnly[m[2]] {
			return true
		}
	}
	return false
}

// parseLanes is Transports' parse of ucp_ep_print_info's text.
func parseLanes(info string) []string {
	seen := map[string]bool{}
	for _, m := range lanePattern.FindAllStringSubmatch(info, -1) {
		seen[pathIndex.ReplaceAllString(m[1], "")] = true
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Close destroys the endpoint's remote keys still live (UCX wants them
// gone before their endpoint) and closes it: flushing it first (force
// false), or at once (force true: after a failure or a timeout), waiting
// at most until deadline; operations in progress on other goroutines
// finish first. An endpoint without peer failure detection (shared
// memory) cannot be closed by force (UCX 1.13), and closing it with a
// flush when its peer is dead never ends: the close's request stays in the
// worker, which then never sleeps again (its arm says busy) and stalls the
// operations of the other endpoints (found by killing a peer mid-copy: a
// core spun and every later copy timed out). Closed by force, such an
// endpoint is abandoned instead: marked closed here, left to UCX until
// the worker is destroyed. Errors: ErrClosed, *Error, ErrTimeout.
func (e *Endpoint) Close(force bool, deadline time.Time) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	e.closed = true
	e.c.life.RLock()
	defer e.c.life.RUnlock()
	for k := range e.keys {
		if !e.c.closed.Load() {
			C.ucp_rkey_destroy(k.rkey)
		}
		k.closed = true
	}
	clear(e.keys)
	if e.c.closed.Load() {
		return ErrClosed
	}
	if force && !e.peerErrors {
		return nil // abandoned (see above)
	}
	f := C.int(0)
	if force {
		f = 1
	}
	return e.c.wait("ucp_ep_close_nbx", C.tfs_close(e.ep, f), deadline, nil)
}

// RemoteKey is a peer region's rkey unpacked for one endpoint, with the
// region's address and length there, which every descriptor is checked
// against. Its state is guarded by its endpoint's mu.
type RemoteKey struct {
	e      *Endpoint
	rkey   C.ucp_rkey_h
	base   uint64
	n      uint64
	closed bool
}

// Unpack unpacks a peer region's packed rkey (its Region.Rkey) for this
// endpoint; base and n are that region's Base and Len. The key is trusted:
// UCX does not validate a packed key's bytes (tensorfs takes rkeys only
// from authenticated peers). Errors: *Error (an empty key, a region that
// is empty or wraps the address space, a key UCX cannot unpack),
// ErrClosed.
func (e *Endpoint) Unpack(rkey []byte, base uint64, n int) (*RemoteKey, error) {
	if len(rkey) == 0 || n <= 0 || base+uint64(n) < base {
		return nil, &Error{Op: "ucp_ep_rkey_unpack", Status: int(C.UCS_ERR_INVALID_PARAM), Msg: fmt.Sprintf("an empty rkey, or a %d-byte region at %#x", n, base)}
	}
	cb := C.CBytes(rkey)
	defer C.free(cb)
	k := &RemoteKey{e: e, base: base, n: uint64(n)}
	e.mu.Lock() // keys changes
	defer e.mu.Unlock()
	e.c.life.RLock()
	defer e.c.life.RUnlock()
	if e.closed || e.c.closed.Load() {
		return nil, ErrClosed
	}
	if err := check("ucp_ep_rkey_unpack", C.ucp_ep_rkey_unpack(e.ep, cb, &k.rkey)); err != nil {
		return nil, err
	}
	e.keys[k] = struct{}{}
	return k, nil
}

// Destroy releases the unpacked key (ucp_rkey_destroy): what a peer does
// when the region's owner revokes it, before the memory goes; it waits
// for the key's operations in progress. Errors: ErrClosed (destroyed
// already, by Destroy or by the endpoint's Close).
func (k *RemoteKey) Destroy() error {
	e := k.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if k.closed {
		return ErrClosed
	}
	k.closed = true
	delete(e.keys, k)
	e.c.life.RLock()
	defer e.c.life.RUnlock()
	if !e.c.closed.Load() {
		C.ucp_rkey_destroy(k.rkey)
	}
	return nil
}

// Desc is one descriptor of a list: N bytes between Local, an address of
// this process (host memory, mapped or not: UCX registers unmapped memory
// on the fly), and byte Off of the remote region.
type Desc struct {
	Local uintptr
	Off   uint64
	N     uint64
}

// Put writes each descriptor's N bytes at Local into the remote region at
// Off, as one posted operation each (ucp_put_nbx) and one flush
// (ucp_ep_flush_nbx): when Put returns nil every byte is in the peer's
// memory. It waits at most until deadline; stop (nil: never), closed,
// tells it the peer is gone when the transport cannot (shared memory): it
// still waits up to two seconds for the operations to end (they may move
// bytes between live buffers), then returns ErrStopped. Errors: ErrRange
// (nothing posted), ErrClosed, *Error (the peer gone: UCS_ERR_ENDPOINT_TIMEOUT,
// UCS_ERR_CONNECTION_RESET...), ErrTimeout, ErrStopped; after an error
// some bytes may have landed, and after ErrTimeout or ErrStopped
// operations may still be running: Local must stay valid until the
// endpoint is closed.
func (k *RemoteKey) Put(descs []Desc, deadline time.Time, stop <-chan struct{}) error {
	return k.post(false, descs, deadline, stop)
}

// Get reads each descriptor's N bytes at Off of the remote region into
// Local, as Put writes them (ucp_get_nbx, one flush). Errors: as Put's
// (after ErrTimeout a get may still write into Local until the endpoint
// is closed).
func (k *RemoteKey) Get(descs []Desc, deadline time.Time, stop <-chan struct{}) error {
	return k.post(true, descs, deadline, stop)
}

// post checks every descriptor against the region, posts them all and
// flushes the endpoint, holding the endpoint (and so the key) open.
func (k *RemoteKey) post(get bool, descs []Desc, deadline time.Time, stop <-chan struct{}) error {
	op := "ucp_put_nbx"
	if get {
		op = "ucp_get_nbx"
	}
	if len(descs) == 0 {
		return nil
	}
	for i, d := range descs {
		if d.N == 0 || d.Off > k.n || d.N > k.n-d.Off {
			return fmt.Errorf("%s: descriptor %d: %d bytes at %d of a %d-byte region: %w", op, i, d.N, d.Off, k.n, ErrRange)
		}
	}
	e := k.e
	return e.use(func() error {
		if k.closed {
			return ErrClosed
		}
		// The list goes to C as one array of (local, remote, length)
		// triples in C memory, read during the call: one cgo call for the
		// list, not one per descriptor.
		mem := C.malloc(C.size_t(24 * len(descs)))
		if mem == nil {
			return fmt.Errorf("%s: %d descriptors: out of memory", op, len(descs))
		}
		defer C.free(mem)
		arr := unsafe.Slice((*C.uint64_t)(mem), 3*len(descs))
		for i, d := range descs {
			arr[3*i], arr[3*i+1], arr[3*i+2] = C.uint64_t(d.Local), C.uint64_t(k.base+d.Off), C.uint64_t(d.N)
		}
		g := C.int(0)
		if get {
			g = 1
		}
		var posted C.size_t
		if err := check(op, C.tfs_post(e.ep, g, &arr[0], C.size_t(len(descs)), k.rkey, &posted)); err != nil {
			// Those posted may be in flight: the flush waits for them (and
			// likely fails the same way) before the error is returned.
			e.c.wait("ucp_ep_flush_nbx", C.tfs_flush(e.ep), deadline, stop)
			return fmt.Errorf("descriptor %d of %d: %w", int(posted), len(descs), err)
		}
		return e.c.wait("ucp_ep_flush_nbx", C.tfs_flush(e.ep), deadline, stop)
	})
}
