package transfer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// inPlaceDest is a Dest that lets a copy write a tensor's bytes in place
// (host memory mapped into the daemon): fill runs on bytes [off, off+n) of
// tensor i, which stay valid until it returns, as the slices of iov in
// order (one, or, for a range list (Meta.Spans), one per span's piece: a
// chunk is read into them by one readv), and returns how many bytes it
// wrote from the first (a stream's read of what its socket held: the
// stream asks again for the rest). ok is false, fill not run,
// when tensor i is not in such memory (GPU memory: the copy stages through
// a buffer and WriteAt). Errors: a range outside the tensor, or fill's.
type inPlaceDest interface {
	WriteInPlace(i int, off, n int64, fill func(iov [][]byte) (int64, error)) (ok bool, err error)
}

// BatchWriter is implemented by a Dest that takes several small chunks as
// one write: GPU memory, one host-to-device copy and one scatter launch,
// where a chunk each cost a staged copy and a stream synchronize (15 µs
// an 8 KiB chunk on an H200). data holds the chunks back to back, each
// already checked (its checksum). done=false: not this batch (nothing written),
// and no later one; the chunks then go one by one through WriteAt.
// Errors as WriteAt's.
type BatchWriter interface {
	WriteBatch(data []byte, chunks []BatchChunk) (done bool, err error)
}

// BatchChunk is one chunk of a WriteBatch: N bytes of its data from Pos,
// for tensor I at byte Off.
type BatchChunk struct {
	I      int
	Off    int64
	Pos, N int
}

// batchBytes is the most chunk bytes a stream gathers for one WriteBatch.
const batchBytes = 1 << 20

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
// frame (all as for sendChunks), and checks that every byte of every tensor
// arrived exactly once and intact. Chunks go straight from the socket into
// the destination's memory when dest allows it (inPlaceDest) and the chunk
// needs no snapshot (it carries no sum, or recheck: request.Recheck, and
// it is summed there as it lands), else through a buffer, checked by
// another goroutine while the stream reads the next one, and WriteAt
// (recvStream). chunk is the sender's chunk size with several streams, 0
// with one (chunks in order).
//
// At the first failure the extra streams are closed, abort runs if set
// (once no write is in flight: the destination is gone before the sender
// hears), then onFail (the server tells the sender why on first); first then
// reads on, discarding, until the sender's end, so it stays in step. With
// abort nil the caller aborts dest on error. The caller releases the extras
// whatever the outcome.
func (s *Service) recvChunks(first *conn, joins <-chan joined, want int, all bool, dest Dest, metas []Meta, chunk int64, recheck bool, rec *Record, abort func(), onFail func(error)) (extras []*stream, firstInStep bool, err error) {
	ss := &streamSet{dead: make(chan struct{}), onFail: onFail, abort: abort}
	tr := newTracker(first.peer, metas, chunk)
	inPlace, _ := dest.(inPlaceDest)
	mode := recvMode{noSum: s.cfg.Checksum == ChecksumNone, recheck: recheck}
	var wg sync.WaitGroup
	var firstDone atomic.Pointer[conn] // first, once it has ended in step
	if want == 0 {
		// One stream: received on this goroutine (no hand-off).
		firstInStep = newRecvStream(first, ss, tr, dest, inPlace, mode, rec).run()
		if err := tr.complete(); err != nil {
			ss.fail(err)
		}
		extras, err = ss.result()
		return extras, firstInStep, err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		firstInStep = newRecvStream(first, ss, tr, dest, inPlace, mode, rec).run()
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
		st.inStep = newRecvStream(st.c, ss, tr, dest, inPlace, mode, rec).run()
	})
	wg.Wait()
	if err := tr.complete(); err != nil {
		ss.fail(err) // a no-op after an earlier failure
	}
	extras, err = ss.result()
	return extras, firstInStep, err
}

// work is one received chunk for a stream's checker: its bytes in place
// (buf nil) or in buf; sum, of kind kind: its checksum (none: nothing to
// check).
type work struct {
	i    int
	off  int64
	n    int64
	sum  uint32
	kind Checksum
	buf  []byte
}

// recvStream is one connection's share of a transfer being received (see
// recvChunks): it reads the frames, puts each chunk's bytes in place or in
// a buffer, and hands the chunk to its checker goroutine, which checks the
// checksum (and writes a buffered chunk) while the stream reads the next one.
type recvStream struct {
	c       *conn
	ss      *streamSet
	tr      *tracker
	dest    Dest
	inPlace inPlaceDest // dest, when it takes bytes in place; else nil
	batch   BatchWriter // dest, when it takes batches of small chunks; else nil
	mode    recvMode
	rec     *Record
	// The small chunks read for the next WriteBatch: their bytes back to
	// back in bbuf, their places in bpend.
	bbuf  []byte
	bpend []BatchChunk

	free chan []byte // buffers the checker gave back
	made int         // buffers made, at most cap(free)
	todo chan work   // to the checker
	// checked is closed when the checker has stopped; nil until the first
	// chunk too large to check inline starts it (a small copy starts no
	// goroutine).
	checked chan struct{}
	chunks  int64 // data frames claimed, for the done frame's count
	hdr     [dataHeaderLen]byte
	iov     [1][]byte // a buffered chunk's, for readFullV
	// A chunk summed as it lands in place (recvMode.recheck): its sum so
	// far, and the pieces of each read, kept to sum them after it.
	sm     summer
	landed [][]byte
}

// recvMode is how a transfer's chunks are taken.
type recvMode struct {
	// noSum: chunks may come without their checksum (this node runs
	// ChecksumNone); else such a chunk is a protocol error.
	noSum bool
	// recheck: the transfer may be summed where its bytes lie
	// (request.Recheck): chunks with a sum land in place too, summed
	// there, and a mismatch is reported as such (Error.recheck).
	recheck bool
}

func newRecvStream(c *conn, ss *streamSet, tr *tracker, dest Dest, inPlace inPlaceDest, mode recvMode, rec *Record) *recvStream {
	batch, _ := dest.(BatchWriter)
	return &recvStream{c: c, ss: ss, tr: tr, dest: dest, inPlace: inPlace, batch: batch, mode: mode, rec: rec, free: make(chan []byte, 3), todo: make(chan work, 2)}
}

// chunkOutcome is what became of one data frame.
type chunkOutcome int

const (
	chunkBuffer  chunkOutcome = iota // not taken in place: read it into a buffer
	chunkPlaced                      // its bytes are in place, to be checked
	chunkSkipped                     // discarded (the transfer failed); the stream goes on
	chunkBroken                      // the stream is out of step
)

// run reads the stream's frames until its done or error frame (true: in
// step) or its failure (false). After the transfer has failed it reads on
// and discards, so that the stream ends in step if the sender ends it.
func (rs *recvStream) run() (inStep bool) {
	defer func() {
		// The gathered chunks land before the stream's end counts: the
		// transfer completes (and commits) after every stream's run.
		rs.flush()
		if rs.bbuf != nil {
			putBuf(rs.bbuf[:cap(rs.bbuf)])
		}
		if rs.checked != nil {
			close(rs.todo)
			<-rs.checked
		}
		// The checker has given every buffer back: to the pool with them.
		for range len(rs.free) {
			putBuf(<-rs.free)
		}
	}()
	c, ss := rs.c, rs.ss
	for {
		c.c.SetReadDeadline(time.Now().Add(c.timeout))
		typ, n, err := readFrameHeader(exactReader{c}, c.max)
		if err != nil {
			if errors.Is(err, ErrFrame) {
				err = fmt.Errorf("%s: %w", c.peer, err)
			}
			ss.fail(netErr(err))
			return false
		}
		plen := int64(n)
		if typ != frameData || ss.failed.Load() || plen < dataHeaderLen {
			if inStep, end := rs.control(typ, plen); end {
				return inStep
			}
			continue
		}
		if !rs.data(plen - dataHeaderLen) {
			return false
		}
	}
}

// control takes a frame that carries no chunk to place: a keepalive, the
// stream's end, or a data frame after the failure (or too short for its
// header). end: the stream is over, in step or not.
func (rs *recvStream) control(typ byte, plen int64) (inStep, end bool) {
	c, ss := rs.c, rs.ss
	p := make([]byte, plen)
	if _, err := io.ReadFull(c.r, p); err != nil {
		ss.fail(netErr(err))
		return false, true
	}
	switch typ {
	case frameKeepalive:
		return false, false
	case frameData:
		if !ss.failed.Load() {
			ss.fail(netErr(fmt.Errorf("data frame of %d bytes: %w", plen, ErrFrame)))
		}
		return false, false
	case frameDone:
		var d doneMsg
		if json.Unmarshal(p, &d) != nil {
			ss.fail(&Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: malformed done frame", c.peer)})
		} else if d.Chunks != rs.chunks && !ss.failed.Load() && rs.tr.chunk > 0 {
			ss.fail(&Error{Errno: syscall.EIO, Msg: fmt.Sprintf("%s: a stream sent %d chunks and says %d", c.peer, rs.chunks, d.Chunks)})
		}
		return true, true
	case frameError:
		ss.fail(wireToError(c.peer, p))
		return true, true
	default:
		ss.fail(&Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: frame type %d in a data stream", c.peer, typ)})
		return false, true
	}
}

// data takes a data frame, whose chunk header and dlen bytes follow: it
// claims the chunk, reads its bytes (in place, or into a buffer) and queues
// it for the checker. False: the stream is out of step.
func (rs *recvStream) data(dlen int64) bool {
	c, ss := rs.c, rs.ss
	if _, err := io.ReadFull(exactReader{c}, rs.hdr[:]); err != nil {
		ss.fail(netErr(err))
		return false
	}
	h, _, err := parseChunk(rs.hdr[:])
	if err == nil && h.kind == ChecksumNone && !rs.mode.noSum {
		err = &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: a chunk without its checksum, which this node checks (it runs without --checksum none)", c.peer)}
	}
	if err == nil {
		err = rs.tr.claim(h.index, h.offset, dlen)
	}
	if err != nil {
		ss.fail(netErr(err))
		return rs.skip(dlen) != chunkBroken
	}
	if rs.chunks++; rs.chunks == 1 {
		rs.rec.noteSum(h.kind)
	}
	w := work{i: int(h.index), off: h.offset, n: dlen, sum: h.sum, kind: h.kind}
	out := chunkBuffer
	if rs.inPlace != nil && (w.kind == ChecksumNone || rs.mode.recheck) {
		out = rs.readInPlace(w)
	}
	switch out {
	case chunkBroken:
		return false
	case chunkSkipped:
		return true
	case chunkPlaced:
		if w.kind != ChecksumNone {
			// Summed as it landed (readInPlace): nothing left to check.
			if rs.sm.sum() != w.sum {
				ss.fail(rs.mismatch(w))
			} else if !ss.failed.Load() {
				rs.rec.BytesDone.Add(w.n)
			}
			return true
		}
	case chunkBuffer:
		if rs.batch != nil && w.n <= inlineMax {
			if ok, taken := rs.readBatched(w); taken {
				return ok
			}
		}
		if !rs.readBuffered(&w) {
			return false
		}
	}
	if w.n <= inlineMax || w.kind == ChecksumNone && w.buf == nil {
		// A small chunk (a KV block) is checked here: handing it to the
		// checker cost a goroutine wake-up per chunk, more than its sum;
		// and one in place without a sum has nothing to check.
		rs.check(w)
		return true
	}
	if rs.checked == nil {
		rs.checked = make(chan struct{})
		go func() {
			defer close(rs.checked)
			for w := range rs.todo {
				rs.check(w)
			}
		}()
	}
	rs.todo <- w
	return true
}

// skip discards a chunk's n bytes.
func (rs *recvStream) skip(n int64) chunkOutcome {
	if _, err := io.CopyN(io.Discard, rs.c.r, n); err != nil {
		return chunkBroken
	}
	return chunkSkipped
}

// readInPlace reads chunk w's bytes from the socket straight into the
// destination's memory, when the destination has it there: what the
// socket holds at each turn, with the destination held only while a readv
// runs, never while the peer is slow to send the rest (an unlink or a
// truncate of it waits for no stalled peer; a sender stopped mid-chunk
// held an rm of the copy's destination for the whole timeout).
//
// A chunk with a sum comes this way only on a transfer that may be summed
// where its bytes lie (recvMode.recheck), summed (rs.sm) from each read's
// bytes while they are hot, before the next read: the destination's
// memory may change under it (overlapping in-place copies race byte by
// byte, and processes write it through their mappings), so a mismatch
// here may be no corruption, and the copy runs again from buffers
// (Error.recheck). Otherwise such a chunk is read into a buffer, checked,
// then written (check, write): summed from the destination without a
// second chance, such copies failed with EIO (72 of 600 concurrent 1 MiB
// copies into one range, 2026-12-06).
func (rs *recvStream) readInPlace(w work) chunkOutcome {
	var done int64
	summed := w.kind != ChecksumNone
	if summed {
		rs.sm.reset(w.kind)
	}
	for {
		var placed bool
		var got int64
		var err, rerr error
		if !rs.ss.guard(func() {
			placed, err = rs.inPlace.WriteInPlace(w.i, w.off+done, w.n-done, func(iov [][]byte) (int64, error) {
				if summed {
					rs.landed = append(rs.landed[:0], iov...) // readSomeV moves iov's slices on
				}
				got, rerr = rs.c.readSomeV(iov, true)
				if summed {
					testHookLanded(rs.landed, got)
					rs.sumLanded(got)
				}
				return got, rerr
			})
		}) {
			// Failed meanwhile: the destination is gone.
			return rs.skip(w.n - done)
		}
		done += got
		switch {
		case rerr != nil:
			rs.ss.fail(netErr(rerr))
			return chunkBroken
		case placed && err != nil:
			// The destination went away under the copy (ENOSPC, a
			// released tensor): the rest of the bytes were not read.
			rs.ss.fail(err)
			return rs.skip(w.n - done)
		case !placed && done > 0:
			rs.ss.fail(&Error{Errno: syscall.EIO, Msg: fmt.Sprintf("%q: in place for %d bytes of a chunk, then not", rs.tr.metas[w.i].Rel, done)})
			return rs.skip(w.n - done)
		case !placed:
			return chunkBuffer
		case done == w.n:
			return chunkPlaced
		}
		if err := rs.c.waitReadable(); err != nil {
			rs.ss.fail(netErr(err))
			return chunkBroken
		}
	}
}

// testHookLanded, in tests, runs on the pieces of the destination's
// memory a read of a chunk summed in place filled (the first n bytes of
// them), before they are summed: a test writes them there, as a process
// that maps the destination, or another copy into it, may.
var testHookLanded = func(pieces [][]byte, n int64) {}

// sumLanded adds the first n bytes of the pieces a read went into
// (rs.landed) to the chunk's sum.
func (rs *recvStream) sumLanded(n int64) {
	for _, p := range rs.landed {
		if n <= 0 {
			break
		}
		k := min(int64(len(p)), n)
		rs.sm.write(p[:k])
		n -= k
	}
	clear(rs.landed)
}

// mismatch is the error of chunk w, whose bytes do not match their
// checksum: EIO, to be rechecked from buffers on a transfer that may be
// summed where its bytes lie (recvMode.recheck).
func (rs *recvStream) mismatch(w work) error {
	// A tree's tensor by its path in the tree; a copy's one tensor (Rel
	// "") by the transfer's destination, as stats name it.
	name := rs.tr.metas[w.i].Rel
	if name == "" && rs.rec != nil {
		name = rs.rec.Dst
	}
	err := &Error{Errno: syscall.EIO, Msg: fmt.Sprintf("%s: checksum mismatch (%s) in %q at %d", rs.c.peer, w.kind, name, w.off)}
	if rs.mode.recheck {
		err.recheck = true
		err.Msg += " (summed where the bytes lie: the copy runs again from buffers)"
	}
	return err
}

// readBatched reads small chunk w's bytes behind the others gathered for
// the next WriteBatch and checks them, flushing the batch first when w
// might not fit. taken is false, nothing read, when that flush found the
// destination declining batches: w goes the buffered way. ok false: the
// stream failed.
func (rs *recvStream) readBatched(w work) (ok, taken bool) {
	if rs.bbuf == nil {
		rs.bbuf = getBuf(batchBytes)[:0]
	}
	if len(rs.bbuf)+int(w.n) > cap(rs.bbuf) {
		if rs.flush(); rs.batch == nil {
			return true, false
		}
	}
	at := len(rs.bbuf)
	p := rs.bbuf[at : at+int(w.n)]
	if _, err := io.ReadFull(rs.c.r, p); err != nil {
		rs.ss.fail(netErr(err))
		return false, true
	}
	if rs.ss.failed.Load() {
		return true, true // read on, in step, until the sender's end
	}
	if w.kind != ChecksumNone && w.kind.sum(p) != w.sum {
		rs.ss.fail(rs.mismatch(w))
		return true, true
	}
	rs.bbuf = rs.bbuf[:at+int(w.n)]
	rs.bpend = append(rs.bpend, BatchChunk{I: w.i, Off: w.off, Pos: at, N: int(w.n)})
	return true, true
}

// flush writes the gathered chunks: one WriteBatch, or one WriteAt each
// when the destination declines (and then for the rest of the stream).
func (rs *recvStream) flush() {
	if len(rs.bpend) == 0 {
		return
	}
	ss := rs.ss
	var n int64
	for _, c := range rs.bpend {
		n += int64(c.N)
	}
	var done bool
	var err error
	ran := true
	if len(rs.bpend) > 1 { // one chunk is one WriteAt, batched or not
		ran = ss.guard(func() { done, err = rs.batch.WriteBatch(rs.bbuf, rs.bpend) })
	}
	if ran && err == nil && !done {
		if len(rs.bpend) > 1 {
			rs.batch = nil
		}
		for _, c := range rs.bpend {
			if ran = ss.guard(func() { err = rs.dest.WriteAt(c.I, rs.bbuf[c.Pos:c.Pos+c.N], c.Off) }); !ran || err != nil {
				break
			}
		}
	}
	switch {
	case !ran:
	case err != nil:
		ss.fail(err)
	default:
		rs.rec.BytesDone.Add(n)
	}
	rs.bbuf, rs.bpend = rs.bbuf[:0], rs.bpend[:0]
}

// readBuffered reads chunk w's bytes into a buffer, w.buf. False: the
// stream failed.
func (rs *recvStream) readBuffered(w *work) bool {
	// At most cap(free) buffers per stream: the checker gives them back.
	var buf []byte
	select {
	case buf = <-rs.free:
	default:
		if rs.made < cap(rs.free) {
			rs.made++
		} else {
			buf = <-rs.free
		}
	}
	if int64(cap(buf)) < w.n {
		putBuf(buf)
		buf = getBuf(int(w.n))
	}
	w.buf = buf
	var err error
	if w.n > inlineMax {
		rs.iov[0] = buf[:w.n]
		err = rs.c.readFullV(rs.iov[:], true)
		rs.iov[0] = nil
	} else {
		// A small chunk through the reader's buffer: one read(2) takes
		// many of them, where one each would cost more than their copy.
		_, err = io.ReadFull(rs.c.r, buf[:w.n])
	}
	if err != nil {
		rs.free <- buf
		rs.ss.fail(netErr(err))
		return false
	}
	return true
}

// check is the checker's work on one chunk: its checksum, then, for a
// buffered chunk, its write into the destination.
func (rs *recvStream) check(w work) {
	ss := rs.ss
	if ss.failed.Load() {
		if w.buf != nil {
			rs.free <- w.buf
		}
		return
	}
	switch {
	case w.kind != ChecksumNone && w.kind.sum(w.buf[:w.n]) != w.sum: // a chunk summed in place was checked there (data)
		ss.fail(rs.mismatch(w))
	case w.buf != nil:
		if err := rs.write(w); err != nil {
			ss.fail(err)
		}
	}
	if w.buf != nil {
		rs.free <- w.buf
	}
	if !ss.failed.Load() {
		rs.rec.BytesDone.Add(w.n)
	}
}

// write puts buffered chunk w into the destination: into its memory when
// it has it there, one pass over the chunk's pieces (a range list's spans)
// under one hold, else through WriteAt (which takes a range list's spans
// one write each).
func (rs *recvStream) write(w work) (err error) {
	rs.ss.guard(func() {
		if rs.inPlace != nil {
			var placed bool
			placed, err = rs.inPlace.WriteInPlace(w.i, w.off, w.n, func(iov [][]byte) (int64, error) {
				src := w.buf[:w.n]
				for _, p := range iov {
					src = src[copy(p, src):]
				}
				return w.n, nil
			})
			if placed {
				return
			}
		}
		err = rs.dest.WriteAt(w.i, w.buf[:w.n], w.off)
	})
	return err
}
