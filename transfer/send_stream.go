package transfer

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"syscall"
)

// sender is the sending side of one transfer's data: reader goroutines fill
// buffers from the sources (device to host for GPU tensors, and the checksum)
// while each stream's writer sends them (write), pipelined: no per-chunk
// acknowledgement; TCP's window keeps each pipe full.
type sender struct {
	srcs  []Source
	rec   *Record
	chunk int64
	ss    *streamSet

	// sum: the checksum the chunks carry (Service.checksumFor). With
	// none, or on a copy that may be summed where its bytes lie
	// (request.Recheck), a source in host memory (hostMem) is sent from
	// there: its frames' bytes are slices of the mapping, written by
	// writev behind their headers, not copied into a buffer first, and
	// summed there. Else a chunk is copied into a buffer and summed in
	// it, one snapshot: a process that maps the source may write it during
	// the copy, and the sum must be of the bytes sent.
	sum     Checksum
	hostMem [][]byte // per source, its host memory from the tensor's byte 0; nil: read it
	hostOff []int64  // per source, where its bytes start in hostMem (one range)

	free chan *sendBuf // empty buffers
	full chan *sendBuf // read chunks, to be sent; closed once the readers stop
	stop chan struct{}
	once sync.Once // closes stop

	readErr     error // set before full is closed
	readErrOnce sync.Once

	// The chunks, in order, handed out to the readers: one reader keeps a
	// single stream's chunks in order; with several streams, order does not
	// matter and the reads and checksums spread over the cores.
	curMu  sync.Mutex
	curI   int
	curOff int64

	// inline: each writer reads its own chunks (no reader goroutines),
	// for transfers of small chunks (descriptor lists of KV blocks),
	// where handing each chunk from a reader to a writer cost a goroutine
	// wake-up per chunk, more than reading it.
	inline bool
	// maxChunk is the largest chunk the sources make, in bytes: an inline
	// block takes another frame while it has room for one this large.
	maxChunk int
}

// inlineMax is the largest chunk sent inline (sender.inline), in bytes:
// past it, reading and checksumming a chunk costs more than the hand-off,
// and the readers' pipelining wins.
const inlineMax = 64 << 10

// frameOverhead is what goes before a chunk's bytes in its buffer: the
// frame's header and the chunk's. A chunk is read into its buffer behind
// them, so that the frame goes to the socket from there (connWriter), not
// copied into the connection's write buffer first.
const frameOverhead = frameHeaderLen + dataHeaderLen

// inlineBlock is the size of an inline writer's buffer, in bytes: it packs
// the frames of small chunks (KV blocks) back to back and sends them in one
// write, as the connection's buffered writer did, without the copy into it.
const inlineBlock = 256 << 10

// sendBuf is one buffer of a sender and what of it goes out: the frames
// read into b, or, for a source sent from its host memory, their headers
// in b and their bytes in that memory.
type sendBuf struct {
	b      []byte
	out    [][]byte // to the socket, in order: slices of b and of sources' host memory
	n      int64    // the chunk bytes out carries
	frames int      // the data frames out carries
}

// recycle gives sb back to free, its slices of sources' memory dropped.
func (sd *sender) recycle(sb *sendBuf) {
	clear(sb.out)
	sb.out = sb.out[:0]
	sd.free <- sb
}

// maxPieces is the most pieces of host memory one chunk is sent from
// (sender.hostMem): one writev takes at most 1024 slices (IOV_MAX), and a
// chunk of more, smaller pieces (a range list of tiny blocks) is cheaper
// gathered into a buffer than described to the kernel piece by piece.
const maxPieces = 256

// newSender prepares the buffers for k streams sending srcs in chunks of
// chunk bytes, each with its checksum of kind sum; recheck: the copy may
// be summed where its bytes lie (request.Recheck).
func newSender(srcs []Source, chunk int64, k int, sum Checksum, recheck bool, rec *Record, ss *streamSet) *sender {
	// Buffers no larger than the largest tensor: a 4 KiB copy should not
	// allocate (and collect) megabytes.
	size := int64(1)
	for _, sc := range srcs {
		size = max(size, min(sc.Meta().NBytes, chunk))
	}
	sd := &sender{srcs: srcs, rec: rec, chunk: chunk, ss: ss, sum: sum, free: make(chan *sendBuf, 2*k+1), stop: make(chan struct{})}
	if sum == ChecksumNone || recheck {
		sd.hostMem, sd.hostOff = make([][]byte, len(srcs)), make([]int64, len(srcs))
		for i, sc := range srcs {
			// The source holds its tensor's allocation still until it is
			// closed, after the writers have stopped (RMASource).
			if rs, ok := sc.(RMASource); ok {
				if m, ok := rs.RMAMemory(); ok && len(m.Mem) > 0 {
					sd.hostMem[i], sd.hostOff[i] = m.Mem, m.Off
				}
			}
		}
	}
	sd.inline = size <= inlineMax
	sd.maxChunk = int(size)
	n := frameOverhead + int(size)
	if sd.inline {
		// A block of frames, no larger than the transfer needs (a 4 KiB
		// copy must not take a 256 KiB buffer).
		need := sd.total() + (frameOverhead+frameAlign)*((sd.total()+size-1)/size)
		n = max(n, int(min(need, inlineBlock)))
	}
	for range cap(sd.free) {
		sd.free <- &sendBuf{b: getBuf(n)}
	}
	sd.full = make(chan *sendBuf, cap(sd.free))
	return sd
}

// total is the bytes of all the sources.
func (sd *sender) total() int64 {
	var n int64
	for _, sc := range sd.srcs {
		n += sc.Meta().NBytes
	}
	return n
}

// release gives the buffers back to the pool, once no reader or writer
// runs: the ones in free (a buffer a failed transfer dropped is collected).
func (sd *sender) release() {
	for {
		select {
		case b := <-sd.free:
			putBuf(b.b)
		default:
			return
		}
	}
}

// halt stops the readers.
func (sd *sender) halt() { sd.once.Do(func() { close(sd.stop) }) }

// next hands out the next chunk to read: bytes [off, off+n) of tensor i.
func (sd *sender) next() (i int, off, n int64, ok bool) {
	sd.curMu.Lock()
	defer sd.curMu.Unlock()
	for sd.curI < len(sd.srcs) && sd.curOff >= sd.srcs[sd.curI].Meta().NBytes {
		sd.curI, sd.curOff = sd.curI+1, 0
	}
	if sd.curI == len(sd.srcs) {
		return 0, 0, 0, false
	}
	i, off = sd.curI, sd.curOff
	n = min(sd.chunk, sd.srcs[i].Meta().NBytes-off)
	sd.curOff += n
	return i, off, n, true
}

// drained reports whether next has no chunk left to hand out.
func (sd *sender) drained() bool {
	sd.curMu.Lock()
	defer sd.curMu.Unlock()
	for i, off := sd.curI, sd.curOff; i < len(sd.srcs); i, off = i+1, 0 {
		if off < sd.srcs[i].Meta().NBytes {
			return false
		}
	}
	return true
}

// startReaders runs n readers, and closes full once they have all stopped.
func (sd *sender) startReaders(n int) {
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sd.read()
		}()
	}
	go func() {
		wg.Wait()
		close(sd.full)
	}()
}

// read is one reader: it reads chunks into free buffers and queues them on
// full, until the chunks run out, a read fails (readErr) or the transfer
// halts.
func (sd *sender) read() {
	for {
		i, off, n, ok := sd.next()
		if !ok {
			return
		}
		var sb *sendBuf
		select {
		case sb = <-sd.free:
		case <-sd.stop:
			return
		}
		sb.out, sb.n, sb.frames = sb.out[:0], n, 1
		if sb.out, _, ok = sd.readChunk(sb.out, sb.b, i, off, n); !ok {
			sd.recycle(sb)
			return
		}
		select {
		case sd.full <- sb:
		case <-sd.stop:
			sd.recycle(sb)
			return
		}
	}
}

// readChunk reads bytes [off, off+n) of source i into buf behind their
// frame and chunk headers (with the checksum, when the chunks carry one) and
// appends the frame to out; a source sent from its host memory (hostMem)
// has only the headers read into buf, and its bytes appended as slices of
// that memory. used is how much of buf the frame took. False when the read
// failed (readErr is set and the transfer halts).
func (sd *sender) readChunk(out [][]byte, buf []byte, i int, off, n int64) (_ [][]byte, used int, ok bool) {
	h := chunkHeader{index: uint32(i), offset: off, kind: sd.sum}
	if sd.hostMem != nil && sd.hostMem[i] != nil {
		if out, ok := sd.hostChunk(out, buf, i, off, n, h); ok {
			return out, frameOverhead, true
		}
	}
	data := buf[frameOverhead : frameOverhead+n]
	got, err := sd.srcs[i].ReadAt(data, off)
	if err == nil && got != len(data) {
		// The source shrank under the copy (fs freezes its sources;
		// another embedder's Source may not): the rest of data is an
		// earlier chunk's bytes, never to be sent as this one's.
		err = &Error{Errno: syscall.EIO, Msg: fmt.Sprintf("%d of %d bytes: the tensor shrank during the copy", got, len(data))}
	}
	if err != nil {
		sd.readErrOnce.Do(func() { sd.readErr = fmt.Errorf("read %s at %d: %w", sd.srcs[i].Meta().Rel, off, err) })
		sd.halt()
		return out, 0, false
	}
	h.sum = sd.sum.sum(data)
	putDataHeaders(buf, n, h)
	return append(out, buf[:frameOverhead+n]), frameOverhead + int(n), true
}

// hostChunk appends the frame of bytes [off, off+n) of source i sent from
// its host memory: the headers, in buf, with the sum of kind h.kind taken
// there, then the bytes, one slice per piece. False, nothing appended,
// when the chunk is more than maxPieces pieces or does not lie inside the
// memory (a source that is not what it said: read the usual way, whose
// errors tell).
func (sd *sender) hostChunk(out [][]byte, buf []byte, i int, off, n int64, h chunkHeader) ([][]byte, bool) {
	mem, m := sd.hostMem[i], sd.srcs[i].Meta()
	if off < 0 || n < 0 || off > m.NBytes-n {
		return out, false
	}
	start := len(out)
	out = append(out, buf[:frameOverhead])
	if m.Spans == nil {
		at := sd.hostOff[i] + off
		if at < 0 || at > int64(len(mem))-n {
			return out[:start], false
		}
		out = append(out, mem[at:at+n])
	} else {
		// Pieces adjacent in the source are one slice: a range list
		// scattered only on the destination's side (KV blocks from one
		// contiguous staging tensor) is then summed in one pass, at the
		// one-shot sum's speed, and written from one iovec.
		k, end := 0, int64(-1)
		err := Pieces(m.Spans, off, n, func(_, src, _, pn int64) error {
			if src < 0 || src > int64(len(mem))-pn {
				return errSkip
			}
			if src == end {
				// The last slice's capacity runs to mem's end, and
				// src+pn lies inside mem (checked above).
				last := &out[len(out)-1]
				*last = (*last)[:len(*last)+int(pn)]
				end += pn
				return nil
			}
			if k++; k > maxPieces {
				return errSkip
			}
			out = append(out, mem[src:src+pn])
			end = src + pn
			return nil
		})
		if err != nil {
			clear(out[start:])
			return out[:start], false
		}
	}
	if h.kind != ChecksumNone {
		defer testHookSentFrom(out[start+1:])
		h.sum = h.kind.sumPieces(out[start+1:])
	}
	putDataHeaders(buf, n, h)
	return out, true
}

// testHookSentFrom, in tests, runs on the pieces of host memory a chunk is
// sent from once their sum is taken, before they are written: a test
// writes them there, as a process that maps the source may.
var testHookSentFrom = func(pieces [][]byte) {}

// putDataHeaders writes the frame and chunk headers of an n-byte chunk
// into buf's first frameOverhead bytes.
func putDataHeaders(buf []byte, n int64, h chunkHeader) {
	putFrameHeader(buf, frameData, dataHeaderLen+int(n))
	putChunkHeader(buf[frameHeaderLen:], h)
}

// errSkip stops a walk over pieces early.
var errSkip = errors.New("skip")

// produce packs the frames of the next chunks into sb, as many as fit,
// each at a multiple of frameAlign (so that its chunk's bytes are aligned:
// see bufPad), for an inline writer, with sb.n the bytes they carry; false
// when the chunks ran out before one was packed, a read failed (readErr) or
// the transfer halted. Frames sent from host memory take only their
// headers' room in the buffer; a block then ends at inlineBlock bytes of
// chunks, as one of frames read into it does.
func (sd *sender) produce(sb *sendBuf) bool {
	sb.out, sb.n, sb.frames = sb.out[:0], 0, 0
	buf := sb.b[:cap(sb.b)]
	pos := 0
	for (pos+frameOverhead+sd.maxChunk <= len(buf) && sb.n+int64(sd.maxChunk) <= inlineBlock) || pos == 0 {
		select {
		case <-sd.stop:
			return false
		default:
		}
		i, off, n, more := sd.next()
		if !more {
			break
		}
		var used int
		var ok bool
		if sb.out, used, ok = sd.readChunk(sb.out, buf[pos:], i, off, n); !ok {
			return false
		}
		sb.n += n
		sb.frames++
		pos = (pos + used + frameAlign - 1) &^ (frameAlign - 1)
	}
	return len(sb.out) > 0
}

// frameAlign is the alignment of the frames an inline writer packs into
// its buffer, in bytes (see bufPad).
const frameAlign = 32

// chunks yields what a writer sends, one buffer's frames at a time: from
// the readers (full), or, inline, the frames read by the writer itself into
// one buffer of its own. A buffer from full goes back to free after the
// yield.
func (sd *sender) chunks(yield func(*sendBuf) bool) {
	if !sd.inline {
		for sb := range sd.full {
			ok := yield(sb)
			sd.recycle(sb)
			if !ok {
				for sb := range sd.full {
					sd.recycle(sb)
				}
				return
			}
		}
		return
	}
	sb := <-sd.free
	defer sd.recycle(sb)
	for !sd.ss.failed.Load() {
		if !sd.produce(sb) || !yield(sb) {
			return
		}
	}
}

// write is one stream's writer: it sends chunks on c until they run out,
// then ends the stream with a done frame (or an error frame for a source
// that could not be read). False: the stream failed, or the transfer did
// (c is out of step).
func (sd *sender) write(c *conn) bool {
	var chunks int64
	for sb := range sd.chunks {
		if sd.ss.failed.Load() {
			continue
		}
		// An inline writer's last block waits in the buffer for the
		// done frame's write (writeFrames' more).
		if err := c.writeFrames(sb.out, sd.inline && sd.drained()); err != nil {
			sd.ss.fail(netErr(err))
			sd.halt()
			continue
		}
		if chunks == 0 && sb.frames > 0 {
			sd.rec.noteSum(sd.sum)
		}
		chunks += int64(sb.frames)
		sd.rec.BytesDone.Add(sb.n)
	}
	if sd.ss.failed.Load() {
		return false
	}
	if sd.readErr != nil {
		c.sendError(sd.readErr)
		return true
	}
	if err := c.sendJSON(frameDone, doneMsg{Chunks: chunks}); err != nil {
		sd.ss.fail(netErr(err))
		return false
	}
	return true
}

// sendChunks streams every source in chunks of chunk bytes (chunkFor) over first and the want extra
// streams that arrive on joins (see sender), and each stream ends with a
// done frame, or with an error frame when a source cannot be read. At the
// first failure the extra streams are closed and onFail runs (the server
// closes first; the client keeps it to read the receiver's reason). all
// says joins always delivers want items (the client's own joins); recheck
// that the chunks may be summed where they lie (request.Recheck). It
// returns the extra streams, to be released whatever the outcome.
func (s *Service) sendChunks(first *conn, joins <-chan joined, want int, all bool, srcs []Source, chunk int, recheck bool, rec *Record, onFail func(error)) ([]*stream, error) {
	ss := &streamSet{dead: make(chan struct{}), onFail: onFail}
	// A destination still preparing (allocating gigabytes, its pages
	// committed) reads nothing while its keepalives say it is alive: each
	// one moves the streams' write deadlines on, or a data phase that
	// starts before the go-ahead (an early put) timed out in a blocked
	// write (a 3 GiB put under --timeout 300ms, 2026-12-06).
	beat := func() { ss.extendWrites(first) }
	first.onBeat.Store(&beat)
	defer first.onBeat.Store(nil)
	k := 1 + want
	sd := newSender(srcs, int64(chunk), k, s.checksumFor(first), recheck, rec, ss)
	readers := 1
	if k > 1 {
		readers = min(k, runtime.GOMAXPROCS(0))
	}
	if sd.inline {
		close(sd.full) // no readers: the writers read
	} else {
		sd.startReaders(readers)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sd.write(first)
	}()
	var watch func() *conn
	if !all {
		watch = func() *conn { return first }
	}
	ss.awaitJoins(joins, want, all, watch, s.cfg.Timeout, &wg, func(st *stream) {
		rec.Streams.Add(1)
		st.inStep = sd.write(st.c)
	})
	if ss.failed.Load() {
		sd.halt()
	}
	wg.Wait()
	sd.halt()
	for sb := range sd.full { // the readers stop; wait for them before the sources close
		sd.recycle(sb)
	}
	sd.release()
	extras, err := ss.result()
	if err == nil && sd.readErr != nil {
		err = sd.readErr
	}
	return extras, err
}
