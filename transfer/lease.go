package transfer

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Leases between daemons of one host (DESIGN.md, "Registration model").
//
// An importer keeps another daemon's allocation open after a copy (opening
// a CUDA IPC handle costs milliseconds), so the exporter must not free that
// allocation while the mapping exists. Each pair of daemons that copy over
// IPC keeps one lease channel: a connection given over to leases, on which
// either side, as exporter, sends frameRevoke with the export ids it is
// retiring, and the other, as importer, closes what it cached for them and
// answers frameRevoked (which it also sends, unasked, when it drops an
// import on its own). The exporter holds one lease per (channel, export id),
// taken when it hands out the export's descriptor with Leased set, and ends
// it on the answer, when the channel dies (a dead importer's leases die with
// its connection), or after the timeout. The importer drops every import
// leased through a channel when that channel dies, because it could no
// longer hear of revocations.
//
// The channel is dialed by whichever side dialed the copy's connection (it
// knows the other's address). When both dial at once, both keep the channel
// dialed by the node with the smaller instance id and close the other.

// PeerLease is an exporter's long-lived lease for a peer importer:
// *ipc.Lease implements it.
type PeerLease interface {
	// Revoked is closed when the exporter retires the memory.
	Revoked() <-chan struct{}
	// Release ends the lease; safe to call more than once.
	Release()
}

// leaseChan is one end of a lease channel.
type leaseChan struct {
	s        *Service
	c        *conn
	peer     string // the peer's name, for logs
	instance string // the peer's instance id
	dialer   string // the instance id of the node that dialed it
	wmu      sync.Mutex
	done     chan struct{}
	once     sync.Once

	mu   sync.Mutex
	held map[uint64]*heldLease // exporter side, by export id

	// lastUse is when a copy last took or looked up the channel, or a
	// revocation last crossed it (unix ns): the idle close counts from
	// it, so a channel whose leases come and go between copies stays
	// open. Set under mu where a lease is taken, so that closeIfIdle
	// (which holds mu) sees either the lease or the fresh time.
	lastUse atomic.Int64
}

// touch records a use of the channel now.
func (lc *leaseChan) touch() { lc.lastUse.Store(time.Now().UnixNano()) }

// unusedFor is how long the channel has gone without a use.
func (lc *leaseChan) unusedFor() time.Duration {
	return time.Duration(time.Now().UnixNano() - lc.lastUse.Load())
}

// heldLease is a lease this node, as exporter, holds for the peer.
type heldLease struct {
	lease PeerLease
	acked chan struct{}
	once  sync.Once
}

func (h *heldLease) ack() { h.once.Do(func() { close(h.acked) }) }

// alive reports whether the channel still runs.
func (lc *leaseChan) alive() bool {
	select {
	case <-lc.done:
		return false
	default:
		return true
	}
}

// sendIDs sends a frameRevoke or frameRevoked; errors end the channel.
func (lc *leaseChan) sendIDs(typ byte, ids []uint64) {
	lc.touch()
	lc.wmu.Lock()
	err := lc.c.sendJSON(typ, idsMsg{IDs: ids})
	lc.wmu.Unlock()
	if err != nil {
		lc.close(fmt.Errorf("send: %v", err))
	}
}

// close ends the channel once: the connection is closed, the leases held
// for the peer are released (by their watchers), and the imports leased
// through it are dropped.
func (lc *leaseChan) close(why error) {
	first := false
	lc.once.Do(func() { close(lc.done); first = true })
	if first {
		lc.finish(why)
	}
}

// closeIfIdle closes the channel when neither side's leases use it and it
// has gone unused for leaseIdle: no lease held for the peer here, no
// import leased through it here (the peer checks its own side the same
// way). Decided under the locks that hold and acquire take, so a lease
// being taken meanwhile either sees the channel end or keeps it. The
// peer may be taking a lease on its side at that moment (after leaseIdle
// of silence): that copy then goes uncached, which costs the next copy an
// import, not correctness (its lease ends with the channel).
func (lc *leaseChan) closeIfIdle() bool {
	first := false
	idle := lc.whileLocked(func(idle bool) {
		if idle = idle && lc.unusedFor() >= lc.s.leaseIdle(); idle {
			lc.once.Do(func() { close(lc.done); first = true })
		}
	})
	if first {
		lc.finish(nil)
	}
	return idle
}

// whileLocked runs fn with whether the channel carries no lease, under the
// import cache's lock and the channel's (the order acquire takes them in),
// and returns that.
func (lc *leaseChan) whileLocked(fn func(idle bool)) bool {
	ic := lc.s.imports
	ic.mu.Lock()
	defer ic.mu.Unlock()
	lc.mu.Lock()
	defer lc.mu.Unlock()
	idle := len(lc.held) == 0 && !ic.leasedThroughLocked(lc) && !lc.s.binds.through(lc)
	fn(idle)
	return idle
}

// finish does the work of closing, once.
func (lc *leaseChan) finish(why error) {
	lc.c.c.Close()
	lc.s.chanMu.Lock()
	if lc.s.chans[lc.instance] == lc {
		delete(lc.s.chans, lc.instance)
	}
	lc.s.chanMu.Unlock()
	lc.s.binds.dropChan(lc)
	n := lc.s.imports.dropChan(lc)
	lc.mu.Lock()
	held := len(lc.held)
	lc.mu.Unlock()
	if why != nil && (n > 0 || held > 0) {
		slog.Info("lease channel ended", "peer", lc.peer, "err", why, "imports_dropped", n, "leases_released", held)
	}
}

// hold records that this node, as exporter, holds l for the peer on export
// id, and watches it: on revocation the peer is told and the lease ends
// with its answer, the channel's end, or the timeout. A second lease on an
// export already held is released at once (one is enough). false: the
// channel has ended; the caller releases l itself.
func (lc *leaseChan) hold(id uint64, l PeerLease) bool {
	lc.mu.Lock()
	if !lc.alive() {
		lc.mu.Unlock()
		return false
	}
	if _, ok := lc.held[id]; ok {
		lc.mu.Unlock()
		l.Release()
		return true
	}
	h := &heldLease{lease: l, acked: make(chan struct{})}
	lc.held[id] = h
	lc.touch()
	lc.mu.Unlock()
	go func() {
		select {
		case <-l.Revoked():
			lc.sendIDs(frameRevoke, []uint64{id})
			t := time.NewTimer(lc.s.cfg.Timeout)
			select {
			case <-h.acked:
			case <-lc.done:
			case <-t.C:
				slog.Warn("no answer to the revocation; lease dropped", "peer", lc.peer, "ipc", id, "seconds", lc.s.cfg.Timeout.Seconds())
			}
			t.Stop()
		case <-h.acked: // the importer dropped it on its own
		case <-lc.done:
		}
		lc.mu.Lock()
		if lc.held[id] == h {
			delete(lc.held, id)
		}
		lc.mu.Unlock()
		l.Release()
	}()
	return true
}

// afterCopy is called, as exporter, when a copy that handed out export id
// with Leased set ends (the importer has imported it by then). That
// descriptor may have reached the importer after the export's frameRevoke
// did (the copy's connection and the lease channel are not ordered), so the
// importer holds a lease that no revocation will reach: when id is revoked
// or no longer held here, it is revoked again (an importer holding nothing
// for it just answers). An id still held and not revoked needs nothing: its
// revocation comes later.
func (lc *leaseChan) afterCopy(id uint64) {
	if !lc.alive() {
		return // the importer drops everything leased through it
	}
	lc.mu.Lock()
	h, ok := lc.held[id]
	lc.mu.Unlock()
	if ok {
		select {
		case <-h.lease.Revoked():
		default:
			return
		}
	}
	lc.sendIDs(frameRevoke, []uint64{id})
}

// run reads the channel until it ends, and keeps it alive meanwhile.
func (lc *leaseChan) run() {
	go func() {
		// Keepalives every third of the timeout; idle checks on the same
		// beat: a channel without leases and unused for leaseIdle closes,
		// so an idle node holds no sockets for leases it no longer needs.
		// Idleness counts from the last use, not from samples: leases
		// that end between one copy and the next (a tensor re-made per
		// step) leave the channel lease-free at many beats while it is
		// busy, and closing it then lost the next copy's lease.
		beat := min(lc.s.cfg.Timeout/3, lc.s.leaseIdle()/2)
		tick := time.NewTicker(beat)
		defer tick.Stop()
		for {
			select {
			case <-lc.done:
				return
			case <-tick.C:
				if lc.unusedFor() >= lc.s.leaseIdle() && lc.closeIfIdle() {
					return
				}
				lc.wmu.Lock()
				err := lc.c.send(frameKeepalive, nil)
				if err == nil {
					err = lc.c.flush()
				}
				lc.wmu.Unlock()
				if err != nil {
					lc.close(fmt.Errorf("keepalive: %v", err))
					return
				}
			}
		}
	}()
	for {
		typ, p, err := lc.c.recv()
		if err != nil {
			lc.close(err)
			return
		}
		lc.touch()
		switch typ {
		case frameBind:
			var m bindMsg
			if json.Unmarshal(p, &m) != nil {
				lc.close(fmt.Errorf("bad bind on a lease channel: %w", ErrFrame))
				return
			}
			// Binding resolves a path, which may wait for a rename that
			// waits for this channel's next frameRevoked: not on the reader.
			go lc.s.serveBind(lc, m)
			continue
		case frameBound:
			var m boundMsg
			if json.Unmarshal(p, &m) != nil {
				lc.close(fmt.Errorf("bad bound on a lease channel: %w", ErrFrame))
				return
			}
			lc.s.installBound(lc, m)
			continue
		}
		var m idsMsg
		if (typ != frameRevoke && typ != frameRevoked) || json.Unmarshal(p, &m) != nil {
			lc.close(fmt.Errorf("frame type %d on a lease channel: %w", typ, ErrFrame))
			return
		}
		switch typ {
		case frameRevoke:
			// Closing a mapping may wait for a copy that still reads it:
			// not on the reader, which must keep hearing the channel.
			// Bindings first: their writes hold the imports.
			go func() {
				gone := lc.s.binds.revoke(lc, m.IDs)
				lc.s.imports.revoke(lc, m.IDs)
				lc.sendIDs(frameRevoked, lc.s.givenBack(lc, m.IDs, gone))
			}()
		case frameRevoked:
			lc.mu.Lock()
			for _, id := range m.IDs {
				if h, ok := lc.held[id]; ok {
					h.ack()
				}
			}
			lc.mu.Unlock()
		}
	}
}

// adopt registers a new channel end for the peer instance, applying the
// tie-break when one is already there (the channel dialed by the smaller
// instance id wins; between two dialed by the same node, the newer: the
// older is one its dialer already closed, unnoticed here yet); false: lc
// lost and was closed.
func (s *Service) adoptChan(lc *leaseChan) bool {
	s.chanMu.Lock()
	if s.chansClosed {
		s.chanMu.Unlock()
		lc.close(nil)
		return false
	}
	old := s.chans[lc.instance]
	if old != nil && old.alive() && old.dialer < lc.dialer {
		s.chanMu.Unlock()
		lc.close(nil)
		return false
	}
	s.chans[lc.instance] = lc
	s.chanMu.Unlock()
	if old != nil {
		old.close(nil)
	}
	return true
}

// leaseChannel returns the live lease channel to the peer instance behind
// c, dialing one when there is none; nil when it cannot (the copy then
// goes on without leases, and the importer does not cache).
func (s *Service) leaseChannel(ctx context.Context, peer string, c *conn) *leaseChan {
	if lc := s.chanTo(c.instance); lc != nil {
		return lc
	}
	s.dialMu.Lock()
	defer s.dialMu.Unlock()
	if lc := s.chanTo(c.instance); lc != nil {
		return lc
	}
	nc, err := s.dial(ctx, peer)
	if err != nil {
		slog.Warn("lease channel failed", "peer", peer, "err", err)
		return nil
	}
	if nc.instance != c.instance {
		nc.c.Close() // the peer restarted in between: the copy's conn is stale anyway
		return nil
	}
	// err is the dial's (nil) here: a refused or broken lease request must
	// not leave a dead channel adopted.
	if err = nc.sendJSON(frameRequest, request{Op: "lease", Path: "/"}); err == nil {
		err = nc.recvJSON(frameOK, nil)
	}
	if err != nil {
		nc.c.Close()
		slog.Warn("lease channel failed", "peer", peer, "err", err)
		return nil
	}
	lc := s.newChan(nc, s.instance)
	if !s.adoptChan(lc) {
		return s.chanTo(c.instance)
	}
	go lc.run()
	return lc
}

func (s *Service) newChan(c *conn, dialer string) *leaseChan {
	// The channel's own reads wait for keepalives, not for work.
	lc := &leaseChan{s: s, c: c, peer: c.peer, instance: c.instance, dialer: dialer, done: make(chan struct{}), held: map[uint64]*heldLease{}}
	lc.touch()
	return lc
}

// chanTo returns the live channel to a peer instance, or nil.
func (s *Service) chanTo(instance string) *leaseChan {
	s.chanMu.Lock()
	defer s.chanMu.Unlock()
	if lc := s.chans[instance]; lc != nil && lc.alive() {
		lc.touch()
		return lc
	}
	return nil
}

// serveLease turns an accepted connection into a lease channel.
func (s *Service) serveLease(c *conn) {
	// Adopted before the answer: the dialer's next request (a get that
	// this node exports for) must find the channel to lease on.
	// The answer goes out under the writer's lock, taken before the
	// channel is found: a copy of this node may revoke on it at once, and
	// its frameRevoke must follow the frameOK, never race it on the socket.
	lc := s.newChan(c, c.instance)
	lc.wmu.Lock()
	if !s.adoptChan(lc) {
		lc.wmu.Unlock()
		return
	}
	err := c.sendJSON(frameOK, reply{})
	lc.wmu.Unlock()
	if err != nil {
		lc.close(err)
		return
	}
	lc.run()
}

// closeChans ends every lease channel (at Close).
func (s *Service) closeChans() {
	s.chanMu.Lock()
	s.chansClosed = true
	all := make([]*leaseChan, 0, len(s.chans))
	for _, lc := range s.chans {
		all = append(all, lc)
	}
	s.chanMu.Unlock()
	for _, lc := range all {
		lc.close(nil)
	}
}

// isIdle reports whether the channel carries no lease now.
func (lc *leaseChan) isIdle() bool { return lc.whileLocked(func(bool) {}) }
