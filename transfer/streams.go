package transfer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	// MaxStreams bounds the parallel TCP streams of one transfer.
	MaxStreams = 8
	// DefaultStreams is the streams a transfer asks for when Config.Streams
	// is 0: measured on loopback (docs/performance.md, "Peer copies").
	DefaultStreams = 2
	// minGridChunk is the smallest chunk size accepted with several streams,
	// in bytes: it bounds the receiver's bitmap of arrived chunks to one bit
	// per KiB of the tensors (whose memory it has already allocated).
	minGridChunk = 1 << 10
	// streamChunks: a transfer takes one stream per streamChunks chunks at
	// most, so a small copy pays no join round trips.
	streamChunks = 4
)

// streamsFor is how many streams a transfer of total bytes in chunks of
// chunk bytes takes when the client asks for want.
func streamsFor(total int64, want, chunk int) int {
	if want <= 1 || chunk < minGridChunk || chunk > MaxFrame-dataHeaderLen-1 {
		return 1
	}
	k := min(int64(want), MaxStreams, total/(streamChunks*int64(chunk)))
	return int(max(k, 1))
}

// stream is one connection carrying part of a transfer's data.
type stream struct {
	c *conn
	// inStep: the stream ended at a frame boundary, after its done (or
	// error) frame, so the connection can serve the next request.
	inStep bool
	// ended, for a connection that joined on this (the server's) side, is
	// told inStep when the transfer is done with it: serveJoin waits on it.
	ended chan bool
}

// joined is an extra stream as it arrives, or the reason it will not.
type joined struct {
	st  *stream
	err error
}

// pending is a transfer that waits for its extra streams to join.
type pending struct {
	s     *Service
	token string
	peer  string
	joins chan joined

	mu     sync.Mutex
	closed bool
	joined int // streams that joined so far
}

// expect registers a transfer with peer that n extra streams will join, and
// returns its token for the reply.
func (s *Service) expect(peer string, n int) *pending {
	p := &pending{s: s, token: string(nonce()), peer: peer, joins: make(chan joined, n)}
	s.mu.Lock()
	if s.pending == nil {
		s.pending = map[string]*pending{}
	}
	s.pending[p.token] = p
	s.mu.Unlock()
	return p
}

// close ends the registration: joins that come later are refused, and
// streams that joined are told whether they are still in step.
func (p *pending) close(extras []*stream) {
	if p == nil {
		return
	}
	p.s.mu.Lock()
	delete(p.s.pending, p.token)
	p.s.mu.Unlock()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	for _, st := range extras {
		st.ended <- st.inStep
	}
	for {
		select {
		case j := <-p.joins: // joined but never taken up
			j.st.ended <- false
		default:
			return
		}
	}
}

// serveJoin adds connection c to the transfer its token names, and waits
// until the transfer is done with it; false means c is out of step (or
// failed) and must be dropped.
func (s *Service) serveJoin(c *conn, req request) bool {
	s.mu.Lock()
	p := s.pending[string(req.Token)]
	s.mu.Unlock()
	if p == nil || p.peer != c.peer {
		c.sendError(&Error{Errno: syscall.ENOENT, Msg: "no transfer to join with that token"})
		return true
	}
	p.mu.Lock()
	if p.closed || p.joined == cap(p.joins) {
		p.mu.Unlock()
		c.sendError(&Error{Errno: syscall.EBUSY, Msg: "the transfer takes no more streams"})
		return true
	}
	if err := c.sendJSON(frameOK, reply{}); err != nil {
		p.mu.Unlock()
		return false
	}
	st := &stream{c: c, ended: make(chan bool, 1)}
	p.joined++
	p.joins <- joined{st: st}
	p.mu.Unlock()
	return <-st.ended
}

// joinStreams opens n extra streams of a transfer to peer (idle connections
// or new ones) and joins them to it with token; each arrives on the channel
// as soon as it is ready (or its error does).
func (s *Service) joinStreams(ctx context.Context, peer string, token []byte, n int) <-chan joined {
	out := make(chan joined, n)
	for range n {
		go func() {
			c, err := s.conn(ctx, peer)
			if err != nil {
				out <- joined{err: err}
				return
			}
			if err := c.sendJSON(frameRequest, request{Op: "join", Path: "/", Token: token}); err != nil {
				c.c.Close()
				out <- joined{err: netErr(err)}
				return
			}
			if err := c.recvJSON(frameOK, nil); err != nil {
				c.c.Close()
				out <- joined{err: err}
				return
			}
			out <- joined{st: &stream{c: c}}
		}()
	}
	return out
}

// releaseStreams gives the client's extra streams back: to the idle pool
// when the transfer succeeded and they ended in step, else closed.
func (s *Service) releaseStreams(peer string, extras []*stream, err error) {
	for _, st := range extras {
		s.done(peer, st.c, st.inStep, err)
	}
}

// streamSet tracks a transfer's streams: the first, and the extras as they
// join; fail closes them all (the extras at once, the first through onFail)
// so that every goroutine of the transfer stops.
type streamSet struct {
	dead   chan struct{} // closed at the failure
	mu     sync.Mutex
	extras []*stream
	err    error
	failed atomic.Bool
	onFail func(error)
	// abort, when set, aborts the destination at the failure, before
	// onFail: once every write in flight (wmu, read-held by each) is over.
	abort func()
	wmu   sync.RWMutex
}

// guard runs fn, a write into the destination, unless the transfer has
// failed; the abort waits for it. False: fn did not run.
func (ss *streamSet) guard(fn func()) bool {
	ss.wmu.RLock()
	defer ss.wmu.RUnlock()
	if ss.failed.Load() {
		return false
	}
	fn()
	return true
}

func (ss *streamSet) add(st *stream) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.err != nil {
		st.c.c.Close()
		ss.extras = append(ss.extras, st)
		return false
	}
	ss.extras = append(ss.extras, st)
	return true
}

// fail records the transfer's first error and stops it.
func (ss *streamSet) fail(err error) {
	ss.mu.Lock()
	if ss.err != nil {
		ss.mu.Unlock()
		return
	}
	ss.err = err
	ss.failed.Store(true)
	close(ss.dead)
	for _, st := range ss.extras {
		st.c.c.Close()
	}
	ss.mu.Unlock()
	if ss.abort != nil {
		ss.wmu.Lock()
		ss.abort()
		ss.wmu.Unlock()
	}
	if ss.onFail != nil {
		ss.onFail(err)
	}
}

func (ss *streamSet) result() ([]*stream, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.extras, ss.err
}

// awaitJoins starts run for each of the want extra streams as it arrives on
// joins, and fails the transfer if one cannot come or they do not all come
// within the timeout. It returns once every arrival has been handled, or at
// the transfer's failure; with all set (the client's joins, which always
// come, connection or error), the ones still to come are then closed as
// they arrive.
//
// watch, when set, gives a connection nobody reads meanwhile, or nil (the
// first stream of a get on the sending side; on the receiving side of a
// put, the first stream once it has ended): if its peer hangs up (or says
// anything: nothing is due on it), the streams will not come, and the
// transfer fails rather than wait out the timeout.
func (ss *streamSet) awaitJoins(joins <-chan joined, want int, all bool, watch func() *conn, timeout time.Duration, wg *sync.WaitGroup, run func(st *stream)) {
	if want == 0 {
		return
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var tick <-chan time.Time
	if watch != nil {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		tick = t.C
	}
	for got := 0; got < want; got++ {
		select {
		case <-tick:
			if w := watch(); w != nil && !alive(w) {
				ss.fail(&Error{Errno: syscall.EIO, Msg: fmt.Sprintf("%s hung up before its streams joined", w.peer), broken: true})
			}
			got--
		case <-ss.dead:
			if all {
				go func() {
					for range want - got {
						if j := <-joins; j.st != nil {
							j.st.c.c.Close()
						}
					}
				}()
			}
			return
		case j := <-joins:
			if j.err != nil {
				ss.fail(j.err)
				continue
			}
			if !ss.add(j.st) {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				run(j.st)
			}()
		case <-deadline.C:
			ss.fail(&Error{Errno: syscall.ETIMEDOUT, Msg: fmt.Sprintf("%d parallel streams did not join within %v", want, timeout), broken: true})
			return
		}
	}
}

// inPlaceDest is a Dest that lets a copy write a tensor's bytes in place
// (host memory mapped into the daemon): fill runs on bytes [off, off+n) of
// tensor i, which stay valid until it returns. ok is false, fill not run,
// when tensor i is not in such memory (GPU memory: the copy stages through
// a buffer and WriteAt). Errors: a range outside the tensor, or fill's.
type inPlaceDest interface {
	WriteInPlace(i int, off, n int64, fill func(p []byte) error) (ok bool, err error)
}

// tracker checks that every byte of every tensor arrives exactly once:
// in order with one stream (chunk 0), on the chunk grid with several.
type tracker struct {
	peer  string
	metas []Meta
	chunk int64

	mu   sync.Mutex
	got  []int64
	seen [][]uint64 // per tensor, one bit per chunk (grid only)
}

func newTracker(peer string, metas []Meta, chunk int64) *tracker {
	t := &tracker{peer: peer, metas: metas, chunk: chunk, got: make([]int64, len(metas))}
	if chunk > 0 {
		t.seen = make([][]uint64, len(metas))
		for i, m := range metas {
			t.seen[i] = make([]uint64, ((m.NBytes+chunk-1)/chunk+63)/64)
		}
	}
	return t
}

// claim admits chunk [off, off+n) of tensor i before its bytes are read
// (into place, so nothing already there may be overwritten). Errors: EPROTO
// for a chunk outside its tensor, out of order, off the grid, or twice.
func (t *tracker) claim(i uint32, off, n int64) error {
	if int(i) >= len(t.metas) || off > t.metas[i].NBytes-n {
		return &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: chunk [%d, +%d) of tensor %d is outside it", t.peer, off, n, i)}
	}
	m := t.metas[i]
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.chunk == 0 {
		if off != t.got[i] {
			// Chunks of a tensor come in order on one stream; anything else
			// would leave holes or write twice.
			return &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: chunk at %d of %q, expected %d", t.peer, off, m.Rel, t.got[i])}
		}
	} else {
		j := off / t.chunk
		if n == 0 || off%t.chunk != 0 || n != min(t.chunk, m.NBytes-off) {
			return &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: chunk [%d, +%d) of %q is not one of its %d-byte chunks", t.peer, off, n, m.Rel, t.chunk)}
		}
		if t.seen[i][j/64]&(1<<(j%64)) != 0 {
			return &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: chunk at %d of %q arrived twice", t.peer, off, m.Rel)}
		}
		t.seen[i][j/64] |= 1 << (j % 64)
	}
	t.got[i] += n
	return nil
}

// complete checks that every tensor arrived whole. Errors: EIO.
func (t *tracker) complete() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, m := range t.metas {
		if t.got[i] != m.NBytes {
			return &Error{Errno: syscall.EIO, Msg: fmt.Sprintf("%s: %q: %d of %d bytes arrived", t.peer, m.Rel, t.got[i], m.NBytes)}
		}
	}
	return nil
}

// recvChunks receives a transfer's chunks into dest from first and the want
// extra streams that arrive on joins, until each has ended with its done
// frame (all as for sendChunks), and checks that every byte of every tensor arrived exactly once and
// intact. Chunks go straight from the socket into the destination's memory
// when dest allows it (inPlaceDest), else through a buffer and WriteAt; the
// CRC32C of a chunk is checked by another goroutine while the stream reads
// the next one. chunk is the sender's chunk size with several streams, 0
// with one (chunks in order).
//
// At the first failure the extra streams are closed, abort runs if set
// (once no write is in flight: the destination is gone before the sender
// hears), then onFail (the server tells the sender why on first); first then
// reads on, discarding, until the sender's end, so it stays in step. With
// abort nil the caller aborts dest on error. The caller releases the extras
// whatever the outcome.
func (s *Service) recvChunks(first *conn, joins <-chan joined, want int, all bool, dest Dest, metas []Meta, chunk int64, rec *Record, abort func(), onFail func(error)) (extras []*stream, firstInStep bool, err error) {
	ss := &streamSet{dead: make(chan struct{}), onFail: onFail, abort: abort}
	tr := newTracker(first.peer, metas, chunk)
	inPlace, _ := dest.(inPlaceDest)
	var wg sync.WaitGroup
	var firstDone atomic.Pointer[conn] // first, once it has ended in step
	wg.Add(1)
	go func() {
		defer wg.Done()
		firstInStep = s.recvStream(first, ss, tr, dest, inPlace, chunk, rec)
		if firstInStep {
			firstDone.Store(first)
		}
	}()
	var watch func() *conn
	if !all {
		watch = firstDone.Load
	}
	ss.awaitJoins(joins, want, all, watch, s.cfg.Timeout, &wg, func(st *stream) {
		rec.Streams.Add(1)
		st.inStep = s.recvStream(st.c, ss, tr, dest, inPlace, chunk, rec)
	})
	wg.Wait()
	if err := tr.complete(); err != nil {
		ss.fail(err) // a no-op after an earlier failure
	}
	extras, err = ss.result()
	return extras, firstInStep, err
}

// work is one received chunk for a stream's checker: its bytes in place
// (buf nil) or in buf.
type work struct {
	i   int
	off int64
	n   int64
	crc uint32
	buf []byte
}

// recvStream reads one stream's frames until its done or error frame (true:
// in step) or its failure (false). After the transfer has failed it reads
// on and discards, so that the stream ends in step if the sender ends it.
func (s *Service) recvStream(c *conn, ss *streamSet, tr *tracker, dest Dest, inPlace inPlaceDest, chunk int64, rec *Record) (inStep bool) {
	free := make(chan []byte, 3)
	todo := make(chan work, 2)
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		for w := range todo {
			if ss.failed.Load() {
				if w.buf != nil {
					free <- w.buf
				}
				continue
			}
			var crc uint32
			var werr error
			ran := true
			if w.buf == nil {
				ran = ss.guard(func() {
					_, werr = inPlace.WriteInPlace(w.i, w.off, w.n, func(p []byte) error {
						crc = crc32.Checksum(p, crcTable)
						return nil
					})
				})
			} else {
				crc = crc32.Checksum(w.buf[:w.n], crcTable)
			}
			switch {
			case !ran:
			case werr != nil:
				ss.fail(werr)
			case crc != w.crc:
				ss.fail(&Error{Errno: syscall.EIO, Msg: fmt.Sprintf("%s: CRC32C mismatch in %q at %d", c.peer, tr.metas[w.i].Rel, w.off)})
			case w.buf != nil:
				ss.guard(func() { werr = dest.WriteAt(w.i, w.buf[:w.n], w.off) })
				if werr != nil {
					ss.fail(werr)
				}
			}
			if w.buf != nil {
				free <- w.buf
			}
			if !ss.failed.Load() {
				rec.BytesDone.Add(w.n)
			}
		}
	}()
	defer func() {
		close(todo)
		<-checked
	}()
	made := 0
	var hdr [dataHeaderLen]byte
	var chunks int64
	for {
		c.c.SetReadDeadline(time.Now().Add(c.timeout))
		typ, n, err := readFrameHeader(c.r, c.max)
		if err != nil {
			if errors.Is(err, ErrFrame) {
				err = fmt.Errorf("%s: %w", c.peer, err)
			}
			ss.fail(netErr(err))
			return false
		}
		plen := int64(n)
		if typ != frameData || ss.failed.Load() || plen < dataHeaderLen {
			p := make([]byte, plen)
			if _, err := io.ReadFull(c.r, p); err != nil {
				ss.fail(netErr(err))
				return false
			}
			switch {
			case typ == frameKeepalive:
				continue
			case typ == frameData:
				if !ss.failed.Load() {
					ss.fail(netErr(fmt.Errorf("data frame of %d bytes: %w", plen, ErrFrame)))
				}
				continue
			case typ == frameDone:
				var d doneMsg
				if json.Unmarshal(p, &d) != nil {
					ss.fail(&Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: malformed done frame", c.peer)})
				} else if d.Chunks != chunks && !ss.failed.Load() && tr.chunk > 0 {
					ss.fail(&Error{Errno: syscall.EIO, Msg: fmt.Sprintf("%s: a stream sent %d chunks and says %d", c.peer, chunks, d.Chunks)})
				}
				return true
			case typ == frameError:
				ss.fail(wireToError(c.peer, p))
				return true
			default:
				ss.fail(&Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: frame type %d in a data stream", c.peer, typ)})
				return false
			}
		}
		if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
			ss.fail(netErr(err))
			return false
		}
		h, _, err := parseChunk(hdr[:])
		dlen := plen - dataHeaderLen
		if err == nil {
			err = tr.claim(h.index, h.offset, dlen)
		}
		if err != nil {
			ss.fail(netErr(err))
			if _, err := io.CopyN(io.Discard, c.r, dlen); err != nil {
				return false
			}
			continue
		}
		chunks++
		w := work{i: int(h.index), off: h.offset, n: dlen, crc: h.crc}
		placed := false
		if inPlace != nil {
			var rerr error
			err = nil
			if !ss.guard(func() {
				placed, err = inPlace.WriteInPlace(w.i, w.off, w.n, func(p []byte) error {
					_, rerr = io.ReadFull(c.r, p)
					return rerr
				})
			}) {
				// Failed meanwhile: the destination is gone.
				if _, err := io.CopyN(io.Discard, c.r, dlen); err != nil {
					return false
				}
				continue
			}
			if rerr != nil {
				ss.fail(netErr(rerr))
				return false
			}
			if placed && err != nil {
				// The destination went away under the copy (ENOSPC, a
				// released tensor): the bytes were not read.
				ss.fail(err)
				if _, err := io.CopyN(io.Discard, c.r, dlen); err != nil {
					return false
				}
				continue
			}
		}
		if !placed {
			// At most cap(free) buffers per stream: the checker gives them
			// back.
			var buf []byte
			select {
			case buf = <-free:
			default:
				if made < cap(free) {
					made++
				} else {
					buf = <-free
				}
			}
			if int64(cap(buf)) < dlen {
				buf = make([]byte, dlen)
			}
			w.buf = buf
			if _, err := io.ReadFull(c.r, buf[:dlen]); err != nil {
				free <- buf
				ss.fail(netErr(err))
				return false
			}
		}
		todo <- w
	}
}
