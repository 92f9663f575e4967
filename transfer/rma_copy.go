package transfer

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// The one-sided path (issue 17). Between daemons of different hosts whose
// UCX endpoint carries bytes (Service.carries: one-sided and detecting a
// dead peer, or any with --ucx-any-endpoint), a copy's request and reply travel on
// the tensorfs connection as for TCP, and the destination reads the bytes
// from the source's memory: the source names that memory as regions
// (address, length, packed rkey: each tensor's own MR, or a staging
// buffer) and where each descriptor is in them, in a put's request or a
// get's reply; the destination unpacks the keys (or finds them kept:
// rmaKeys), posts one get per contiguous run and flushes, and commits (a
// put: then replies; a get: says frameDone first, so the source lets go). Only
// sources are reached from outside; memory UCX cannot reach (GPU memory
// without CUDA-aware UCX, an in-place range overlapping another of the
// call) is staged through host memory on its own node: read into a stage
// before the offer (a source), written from one after the gets (a
// destination).

// rmaRegion is memory of a node that its peer reaches one-sided: Len bytes
// at Addr there, with its packed rkey.
type rmaRegion struct {
	Addr uint64 `json:"addr"`
	Len  int64  `json:"len"`
	Rkey []byte `json:"rkey"`
}

// rmaTarget is where a source descriptor's bytes are in region R of an
// offer: Linear (a staging buffer), laid end to end from Off; else at the
// tensor's own offsets, a range list's spans at their Src, one range from
// Off.
type rmaTarget struct {
	R      int   `json:"r"`
	Off    int64 `json:"off"`
	Linear bool  `json:"linear,omitempty"`
}

// rmaRun is n bytes of a descriptor from its byte pos, at at: an address
// in this process, or an offset in a peer's region.
type rmaRun struct{ pos, at, n int64 }

// runsAt appends where descriptor m's bytes are, from base: its spans'
// own offsets (Src when src, else Dst) when spans and it has them; else
// laid end to end from off.
func runsAt(rs []rmaRun, m Meta, base, off int64, spans, src bool) []rmaRun {
	if !spans || m.Spans == nil {
		return append(rs, rmaRun{0, base + off, m.NBytes})
	}
	for _, sp := range m.Spans {
		at := sp.Dst
		if src {
			at = sp.Src
		}
		rs = append(rs, rmaRun{sp.Pos, base + at, sp.N})
	}
	return rs
}

// zipRuns appends to ops one operation per piece where a descriptor's
// local and remote runs meet: both cover its bytes in order. Errors:
// EPROTO when they do not cover the same bytes.
func zipRuns(ops []RMADesc, local, remote []rmaRun) ([]RMADesc, error) {
	i, j := 0, 0
	var li, rj int64
	for i < len(local) && j < len(remote) {
		l, r := local[i], remote[j]
		if l.n == 0 {
			i++
			continue
		}
		if r.n == 0 {
			j++
			continue
		}
		if l.pos+li != r.pos+rj {
			return nil, &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("runs at byte %d and %d of a descriptor", l.pos+li, r.pos+rj)}
		}
		n := min(l.n-li, r.n-rj)
		ops = append(ops, RMADesc{Local: uintptr(l.at + li), Off: uint64(r.at + rj), N: uint64(n)})
		if li += n; li == l.n {
			i, li = i+1, 0
		}
		if rj += n; rj == r.n {
			j, rj = j+1, 0
		}
	}
	for ; i < len(local); i++ {
		if local[i].n-li != 0 {
			return nil, &Error{Errno: syscall.EPROTO, Msg: "a descriptor's runs here and at the peer differ in length"}
		}
		li = 0
	}
	for ; j < len(remote); j++ {
		if remote[j].n-rj != 0 {
			return nil, &Error{Errno: syscall.EPROTO, Msg: "a descriptor's runs here and at the peer differ in length"}
		}
		rj = 0
	}
	return ops, nil
}

// rmaStage is host memory of this process for the bytes of descriptors
// whose tensors the transport cannot reach: mapped anonymous memory outside
// Go's heap (UCX holds its address while operations run), mapped for the
// transport too when the peer reaches it (remote). It holds every staged
// byte of the transfer at once; mem is its first n bytes. Stages are
// kept for the next transfer (stagePool): a fresh one cost its page
// faults and its UCX mapping every copy.
type rmaStage struct {
	all   []byte // the mapping, a power of two of at least minStage bytes
	mem   []byte
	rkey  []byte
	unmap func() error
	pool  *stagePool
}

// stagePool keeps freed stages, local and remote apart, up to
// stagePoolBytes in all; the rest are unmapped. Close unmaps them all.
type stagePool struct {
	mu     sync.Mutex
	free   [2]map[int][]*rmaStage // [remote] by len(all)
	bytes  int64
	closed bool
}

// stagePoolBytes bounds the staging memory kept between transfers (a
// GiB's copy keeps its GiB for the next).
const stagePoolBytes = 2 << 30

// minStage is the smallest stage mapped (a page).
const minStage = 4096

// newStage returns a stage of n bytes (nil for 0), from the pool when it
// has one of n's size class. Errors: ENOMEM, or the transport's mapping
// error (EIO).
func (s *Service) newStage(n int64, remote bool) (*rmaStage, error) {
	if n == 0 {
		return nil, nil
	}
	size := minStage
	for int64(size) < n {
		size <<= 1
	}
	p := &s.stages
	r := 0
	if remote {
		r = 1
	}
	p.mu.Lock()
	if l := p.free[r][size]; len(l) > 0 {
		st := l[len(l)-1]
		p.free[r][size] = l[:len(l)-1]
		p.bytes -= int64(size)
		p.mu.Unlock()
		st.mem = st.all[:n]
		return st, nil
	}
	p.mu.Unlock()
	all, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_NORESERVE)
	if err != nil {
		return nil, &Error{Errno: syscall.ENOMEM, Msg: fmt.Sprintf("staging %d bytes for a one-sided copy: %v", n, err)}
	}
	st := &rmaStage{all: all, mem: all[:n], pool: p}
	if remote {
		if st.rkey, st.unmap, err = s.cfg.RMA.Map(st.addr(), len(all)); err != nil {
			syscall.Munmap(all)
			return nil, &Error{Errno: syscall.EIO, Msg: fmt.Sprintf("mapping a %d-byte staging buffer: %v", size, err)}
		}
	}
	return st, nil
}

func (st *rmaStage) addr() uintptr { return uintptr(unsafe.Pointer(&st.all[0])) }

// free gives the stage back to its pool, or unmaps it when the pool is
// full or closed; nil does nothing.
func (st *rmaStage) free() {
	if st == nil {
		return
	}
	p := st.pool
	r := 0
	if st.unmap != nil {
		r = 1
	}
	p.mu.Lock()
	if !p.closed && p.bytes+int64(len(st.all)) <= stagePoolBytes {
		if p.free[r] == nil {
			p.free[r] = map[int][]*rmaStage{}
		}
		p.free[r][len(st.all)] = append(p.free[r][len(st.all)], st)
		p.bytes += int64(len(st.all))
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	st.release()
}

// release unmaps the stage for good.
func (st *rmaStage) release() {
	if st.unmap != nil {
		if err := st.unmap(); err != nil {
			slog.Error("ucx: unmapping a staging buffer", "err", err)
		}
	}
	syscall.Munmap(st.all)
}

// close unmaps every kept stage; later frees unmap theirs (Service.Close,
// before the RMA context goes).
func (p *stagePool) close() {
	p.mu.Lock()
	p.closed = true
	var all []*rmaStage
	for r := range p.free {
		for _, l := range p.free[r] {
			all = append(all, l...)
		}
		p.free[r] = nil
	}
	p.bytes = 0
	p.mu.Unlock()
	for _, st := range all {
		st.release()
	}
}

// rmaOffer is the memory of one side of a transfer that the peer reaches:
// the regions and targets of the reply, and the stage behind the staged
// descriptors (at stageAt[i], -1 for one in a tensor).
type rmaOffer struct {
	regions []rmaRegion
	targets []rmaTarget
	stage   *rmaStage
	stageAt []int64
}

// offer builds the memory this node offers for metas: each descriptor's
// tensor when mem(i) gives it mapped (one region per tensor), else a
// place in one staging buffer (remote-mapped). fill, when set, writes the
// staged descriptors' bytes into it (a get's sources). Errors: newStage's,
// fill's.
func (s *Service) offer(metas []Meta, mem func(i int) (RMAMemory, bool), fill func(i int, p []byte) error) (*rmaOffer, error) {
	o := &rmaOffer{targets: make([]rmaTarget, len(metas)), stageAt: make([]int64, len(metas))}
	byAddr := map[uintptr]int{}
	var staged int64
	for i, m := range metas {
		o.stageAt[i] = -1
		if mm, ok := mem(i); ok && mm.Rkey != nil && len(mm.Mem) > 0 {
			r, seen := byAddr[mm.addr()]
			if !seen {
				r = len(o.regions)
				byAddr[mm.addr()] = r
				o.regions = append(o.regions, rmaRegion{Addr: uint64(mm.addr()), Len: int64(len(mm.Mem)), Rkey: mm.Rkey})
			}
			o.targets[i] = rmaTarget{R: r, Off: mm.Off}
			continue
		}
		o.stageAt[i] = staged
		staged += m.NBytes
	}
	if staged == 0 {
		return o, nil
	}
	st, err := s.newStage(staged, true)
	if err != nil {
		return nil, err
	}
	o.stage = st
	r := len(o.regions)
	o.regions = append(o.regions, rmaRegion{Addr: uint64(st.addr()), Len: staged, Rkey: st.rkey})
	for i, at := range o.stageAt {
		if at < 0 {
			continue
		}
		o.targets[i] = rmaTarget{R: r, Off: at, Linear: true}
		if fill != nil {
			if err := fill(i, st.mem[at:at+metas[i].NBytes]); err != nil {
				st.free()
				return nil, err
			}
		}
	}
	return o, nil
}

// rmaOps is the operations of a transfer on the peer's memory, by region.
type rmaOps struct {
	regions []rmaRegion
	ops     [][]RMADesc
	stage   *rmaStage // local staging of descriptors in GPU memory here
	stageAt []int64
	bytes   int64
}

// plan builds the gets from the peer's memory into this node's: metas
// are this node's descriptors (the destination's), theirs the peer's (the
// source's) in the same order, r the peer's regions and targets over
// theirs. mem(i) is descriptor i's tensor here when the transport reaches
// it; the others stage here (a local stage: the gets land in it). Errors:
// EPROTO for regions or targets that do not match metas; newStage's.
func (s *Service) plan(metas, theirs []Meta, r reply, mem func(i int) (RMAMemory, bool)) (*rmaOps, error) {
	if len(r.RMAAt) != len(metas) || len(theirs) != len(metas) {
		return nil, &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("the peer's one-sided answer names %d descriptors of %d", len(r.RMAAt), len(metas))}
	}
	for k, rg := range r.RMA {
		if rg.Len <= 0 || len(rg.Rkey) == 0 {
			return nil, &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("the peer's region %d: %d bytes, a %d-byte rkey", k, rg.Len, len(rg.Rkey))}
		}
	}
	p := &rmaOps{regions: r.RMA, ops: make([][]RMADesc, len(r.RMA)), stageAt: make([]int64, len(metas))}
	var staged int64
	mems := make([]RMAMemory, len(metas))
	for i, m := range metas {
		if m.NBytes == 0 {
			p.stageAt[i] = -1 // nothing to move, nowhere to point
			continue
		}
		if t := r.RMAAt[i]; t.R < 0 || t.R >= len(r.RMA) {
			return nil, &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("descriptor %d in the peer's region %d of %d", i, t.R, len(r.RMA))}
		}
		p.stageAt[i] = -1
		if mm, ok := mem(i); ok {
			mems[i] = mm
			continue
		}
		p.stageAt[i] = staged
		staged += m.NBytes
	}
	st, err := s.newStage(staged, false)
	if err != nil {
		return nil, err
	}
	p.stage = st
	var local, remote []rmaRun
	for i, m := range metas {
		if m.NBytes == 0 {
			continue
		}
		local, remote = local[:0], remote[:0]
		if at := p.stageAt[i]; at >= 0 {
			local = append(local, rmaRun{0, int64(st.addr()) + at, m.NBytes})
		} else {
			local = runsAt(local, m, int64(mems[i].addr()), mems[i].Off, true, false)
		}
		t := r.RMAAt[i]
		remote = runsAt(remote, theirs[i], 0, t.Off, !t.Linear, true)
		if p.ops[t.R], err = zipRuns(p.ops[t.R], local, remote); err != nil {
			st.free()
			return nil, fmt.Errorf("descriptor %d: %w", i, err)
		}
		p.bytes += m.NBytes
	}
	return p, nil
}

// run posts every get, one region's at a time, each region's rkey
// unpacked on p's endpoint (or found in its cache: rmaKeys), and waits
// until deadline or stop. Errors: the transport's, wrapped with EIO
// (ECONNRESET after stop, ETIMEDOUT past the deadline).
func (o *rmaOps) run(p *rmaPeer, deadline time.Time, stop <-chan struct{}) error {
	for k, ops := range o.ops {
		if len(ops) == 0 {
			continue
		}
		rg := o.regions[k]
		key, release, err := p.keys.get(p.ep, rg)
		if err != nil {
			return &Error{Errno: syscall.EIO, Msg: fmt.Sprintf("the peer's rkey of region %d: %v", k, err)}
		}
		err = key.Get(ops, deadline, stop)
		release()
		if err != nil {
			errno := syscall.EIO
			select {
			case <-stop:
				errno = syscall.ECONNRESET
			default:
				if time.Now().After(deadline) {
					errno = syscall.ETIMEDOUT
				}
			}
			return &Error{Errno: errno, Msg: fmt.Sprintf("one-sided get of %d runs: %v", len(ops), err)}
		}
	}
	return nil
}

// rmaKeys caches the rkeys a node has unpacked on its endpoint to one
// peer, by the region's exact description (packed key, address, length):
// ucp_ep_rkey_unpack and ucp_rkey_destroy cost microseconds each (several
// on the VM), a small copy's whole budget. A cached key is only used for
// a region the peer offers again in a transfer's request or reply, with
// the same packed bytes, while it holds that region frozen for the
// transfer: the same bytes name the same registration (an RDMA rkey; the
// shared-memory segment and address UCX's own attachment cache keys on),
// so a key is never used for memory its owner no longer offers. Keys of
// regions that are gone just sit until evicted (least recently used past
// maxRMAKeys; never one in use) or until the endpoint closes, which
// destroys them.
type rmaKeys struct {
	mu    sync.Mutex
	m     map[rmaKeyID]*rmaKey
	clock int64
}

type rmaKeyID struct {
	rkey string
	addr uint64
	n    int64
}

type rmaKey struct {
	id   rmaKeyID
	key  RMAKey
	refs int
	used int64
}

// maxRMAKeys bounds a peer's cached keys (a KV cache of a layer per
// tensor offers a few hundred regions).
const maxRMAKeys = 1024

// get returns region rg's key, unpacked on ep on a miss, held until
// release is called.
func (c *rmaKeys) get(ep RMAEndpoint, rg rmaRegion) (RMAKey, func(), error) {
	id := rmaKeyID{string(rg.Rkey), rg.Addr, rg.Len}
	c.mu.Lock()
	c.clock++
	if k := c.m[id]; k != nil {
		k.refs++
		k.used = c.clock
		c.mu.Unlock()
		return k.key, func() { c.release(k) }, nil
	}
	c.mu.Unlock()
	key, err := ep.Unpack(rg.Rkey, rg.Addr, int(rg.Len))
	if err != nil {
		return nil, nil, err
	}
	k := &rmaKey{id: id, key: key, refs: 1}
	c.mu.Lock()
	if c.m == nil {
		c.m = map[rmaKeyID]*rmaKey{}
	}
	if old := c.m[id]; old != nil {
		// Another transfer unpacked it meanwhile: keep one.
		old.refs++
		c.mu.Unlock()
		key.Destroy()
		return old.key, func() { c.release(old) }, nil
	}
	c.clock++
	k.used = c.clock
	c.m[id] = k
	var evict []*rmaKey
	for len(c.m) > maxRMAKeys {
		var lru *rmaKey
		for _, e := range c.m {
			if e.refs == 0 && (lru == nil || e.used < lru.used) {
				lru = e
			}
		}
		if lru == nil {
			break // all in use: over the bound until they are released
		}
		delete(c.m, lru.id)
		evict = append(evict, lru)
	}
	c.mu.Unlock()
	for _, e := range evict {
		e.key.Destroy()
	}
	return key, func() { c.release(k) }, nil
}

func (c *rmaKeys) release(k *rmaKey) {
	c.mu.Lock()
	k.refs--
	c.mu.Unlock()
}

// whileOneSided runs fn, this node's one-sided operations on the memory
// of c's peer, which waits on c for their end, saying nothing: keepalives
// go out meanwhile (whileSilent), and stop closes if the peer hangs up or
// says anything (it gave up: its error frame stays unread for the
// caller), which a transport without peer failure detection (UCX's shared
// memory) would not tell fn.
func (c *conn) whileOneSided(fn func(stop <-chan struct{}) error) error {
	stop := make(chan struct{})
	watched := make(chan struct{})
	c.c.idle.Store(true) // the watch sleeps in the poller, not spinning
	c.c.SetReadDeadline(time.Time{})
	go func() {
		defer close(watched)
		if _, err := c.r.Peek(1); err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			close(stop)
		}
	}()
	err := c.whileSilent(func() error { return fn(stop) })
	c.c.SetReadDeadline(time.Now()) // ends the watch
	<-watched
	// The reply comes next, within microseconds: read it spinning
	// (closingConn.idle), not asleep.
	c.c.idle.Store(false)
	return err
}

// rmaRate is the slowest rate a one-sided transfer is given time for
// (10 MB/s), on top of the timeout: a put's flush reports no progress, so
// its deadline is set by its size.
const rmaRate = 10e6

// rmaDeadline bounds a one-sided transfer of n bytes.
func (s *Service) rmaDeadline(n int64) time.Time {
	return time.Now().Add(s.cfg.Timeout + time.Duration(float64(n)/rmaRate*float64(time.Second)))
}

// carrier is rmaTo's endpoint when it carries copies (carries), else nil:
// the endpoint a peer's RMA request is served on, this node's own say.
func (s *Service) carrier(peer, instance string) *rmaPeer {
	if p := s.rmaTo(peer, instance); s.carries(p) {
		return p
	}
	return nil
}

// rmaTo is the endpoint to the run instance of peer, or nil.
func (s *Service) rmaTo(peer, instance string) *rmaPeer {
	if s.cfg.RMA == nil {
		return nil
	}
	s.rmaMu.Lock()
	defer s.rmaMu.Unlock()
	if p := s.rma[peer]; p != nil && p.instance == instance {
		return p
	}
	return nil
}

// dropRMA forgets the endpoint p to peer after an operation on it failed
// and closes it forcibly, which cancels what it still has in flight
// before the peer unpins the memory: the next handshake with the peer
// makes a new one.
func (s *Service) dropRMA(peer string, p *rmaPeer) {
	s.rmaMu.Lock()
	if s.rma[peer] == p {
		delete(s.rma, peer)
	}
	s.rmaMu.Unlock()
	if err := p.ep.Close(true, time.Now().Add(rmaCloseWait)); err != nil {
		slog.Warn("ucx: closing the endpoint after a failed copy", "peer", peer, "err", err)
	}
}

// trackVia marks rec as moved on p's transports.
func trackVia(rec *Record, p *rmaPeer) {
	if p != nil {
		t := p.transports
		rec.via.Store(&t)
	}
}

// errNoRMA: the peer answered an RMA request as a TCP one (it has no RMA
// transport after all, or its endpoint to this node carries no copies);
// the copy goes on TCP, in a record of its own after this attempt's.
var errNoRMA = errors.New("the peer answered on TCP (no UCX endpoint of its own that carries copies): copied on TCP instead")

// rmaPush runs a put on c whose bytes the destination reads one-sided:
// the sources' memory offered in the request req (GPU memory read into a
// stage first), then the destination's reply once it has read every byte
// and committed; the sources stay open (pinned) until then. tcp, with
// errNoRMA, is a TCP go-ahead (a destination without a one-sided endpoint
// to this node): the caller moves the data on the streams.
//
// The destination reads rather than this node writing: one round trip
// fewer than regions-then-puts, and no write of ours can land in its
// memory after it has given up on the copy (a read that outlives this
// node's own give-up reads stale bytes into the destination's range, which
// the aborted copy leaves as undefined as a failed RDMA WRITE would).
func (s *Service) rmaPush(c *conn, srcs []Source, metas []Meta, req request, rec *Record) (n int, tcp *reply, err error) {
	o, err := s.offer(metas, sourceMemory(srcs), func(i int, p []byte) error {
		_, err := srcs[i].ReadAt(p, 0)
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	defer o.stage.free()
	req.RMA, req.RMASrc, req.RMASrcAt = true, o.regions, o.targets
	if err := c.sendJSON(frameRequest, req); err != nil {
		return 0, nil, netErr(err)
	}
	var r reply
	if err := c.recvJSON(frameOK, &r); err != nil {
		return 0, nil, err
	}
	if !r.RMADone {
		return 0, &r, errNoRMA
	}
	rec.BytesDone.Store(rec.BytesTotal.Load())
	return r.Copied, nil, nil
}

// sourceMemory is the RMAMemory of each of srcs that has it.
func sourceMemory(srcs []Source) func(i int) (RMAMemory, bool) {
	return func(i int) (RMAMemory, bool) {
		if rs, ok := srcs[i].(RMASource); ok {
			return rs.RMAMemory()
		}
		return RMAMemory{}, false
	}
}

// servePutRMA receives a put by reading the sender's memory one-sided on
// p, the endpoint to it: the destination prepared, the bytes read (GPU
// memory here staged), the commit, the reply.
func (s *Service) servePutRMA(c *conn, req request, p *rmaPeer) error {
	rec, end := s.Track(c.peer, req.Path, "ucx", req.Tensors)
	trackVia(rec, p)
	src := reply{Tensors: req.Tensors, RMA: req.RMASrc, RMAAt: req.RMASrcAt}
	n, err := Deliver(rec, req.Tensors, s.putPrepare(c, req, false), func(dest Dest, _ func()) error {
		return s.rmaRead(c, p, src, req.Tensors, dest, rec, nil)
	}, s.putCommit(c))
	end(err)
	if err != nil {
		return err
	}
	return c.sendJSON(frameOK, reply{Copied: n, RMADone: true})
}

// rmaRead reads a transfer's bytes one-sided on p's endpoint from the
// peer's memory r names (its regions and targets over r.Tensors, the
// peer's descriptors) into dest (descs: this node's descriptors, in the
// same order); then, before the bytes staged here (GPU memory) are
// written, runs got (a pull's done to the source; nil for a push). A
// failure is told to the peer too, which waits on c.
func (s *Service) rmaRead(c *conn, p *rmaPeer, r reply, descs []Meta, dest Dest, rec *Record, got func() error) error {
	mem := func(i int) (RMAMemory, bool) {
		if rd, ok := dest.(RMADest); ok {
			return rd.RMAMemory(i)
		}
		return RMAMemory{}, false
	}
	ops, err := s.plan(descs, r.Tensors, r, mem)
	if err != nil {
		c.sendError(err)
		return err
	}
	defer ops.stage.free()
	if err := c.whileOneSided(func(stop <-chan struct{}) error { return ops.run(p, s.rmaDeadline(ops.bytes), stop) }); err != nil {
		s.dropRMA(c.peer, p)
		c.sendError(err)
		return err
	}
	if got != nil {
		if err := got(); err != nil {
			return err
		}
	}
	for i, at := range ops.stageAt {
		if at < 0 {
			continue
		}
		if err := dest.WriteAt(i, ops.stage.mem[at:at+descs[i].NBytes], 0); err != nil {
			if got == nil {
				c.sendError(err)
			}
			return err
		}
	}
	rec.BytesDone.Store(ops.bytes)
	return nil
}

// rmaPullData moves a get's bytes one-sided on p's endpoint from the
// peer's memory r names into dest (rmaRead), telling the peer it may let
// go of its memory (frameDone) as soon as they are here.
func (s *Service) rmaPullData(c *conn, p *rmaPeer, r reply, descs []Meta, dest Dest, rec *Record) error {
	return s.rmaRead(c, p, r, descs, dest, rec, func() error {
		if err := c.sendJSON(frameDone, doneMsg{}); err != nil {
			return netErr(err)
		}
		return nil
	})
}

// serveGetRMA answers a get one-sided: the sources' memory offered
// (GPU memory read into a stage first), then the puller's done awaited
// while the sources stay open; p is this node's endpoint to the puller.
func (s *Service) serveGetRMA(c *conn, p *rmaPeer, srcs []Source, metas, recMetas []Meta, isDir bool, label string) error {
	rec, end := s.Track(label, c.peer, "ucx", recMetas)
	trackVia(rec, p)
	var o *rmaOffer
	err := c.whileSilent(func() (err error) {
		o, err = s.offer(metas, sourceMemory(srcs), func(i int, p []byte) error {
			_, err := srcs[i].ReadAt(p, 0)
			return err
		})
		return err
	})
	if err != nil {
		c.sendError(err)
		end(err)
		return err
	}
	defer o.stage.free()
	if err := c.sendJSON(frameOK, reply{Dir: isDir, Tensors: metas, RMA: o.regions, RMAAt: o.targets}); err != nil {
		end(err)
		return netErr(err)
	}
	err = c.recvJSON(frameDone, nil)
	if err == nil {
		rec.BytesDone.Store(rec.BytesTotal.Load())
	}
	end(err)
	var te *Error
	if errors.As(err, &te) && !te.broken {
		return nil // the puller's own failure; the connection is fine
	}
	return err
}
