package transfer

import (
	"fmt"
	"hash/crc32"
	"runtime"
	"sync"
	"syscall"
)

// sender is the sending side of one transfer's data: reader goroutines fill
// buffers from the sources (device to host for GPU tensors, and the CRC32C)
// while each stream's writer sends them (write), pipelined: no per-chunk
// acknowledgement; TCP's window keeps each pipe full.
type sender struct {
	srcs  []Source
	rec   *Record
	chunk int64
	ss    *streamSet

	free chan []byte // empty buffers, header and chunk
	full chan []byte // read chunks, to be sent; closed once the readers stop
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

// newSender prepares the buffers for k streams sending srcs in chunks of
// chunk bytes.
func newSender(srcs []Source, chunk int64, k int, rec *Record, ss *streamSet) *sender {
	// Buffers no larger than the largest tensor: a 4 KiB copy should not
	// allocate (and collect) megabytes.
	size := int64(1)
	for _, sc := range srcs {
		size = max(size, min(sc.Meta().NBytes, chunk))
	}
	sd := &sender{srcs: srcs, rec: rec, chunk: chunk, ss: ss, free: make(chan []byte, 2*k+1), stop: make(chan struct{})}
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
		sd.free <- getBuf(n)
	}
	sd.full = make(chan []byte, cap(sd.free))
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
			putBuf(b)
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
		var buf []byte
		select {
		case buf = <-sd.free:
		case <-sd.stop:
			return
		}
		chunk, ok := sd.readChunk(buf, i, off, n)
		if !ok {
			return
		}
		select {
		case sd.full <- chunk:
		case <-sd.stop:
			return
		}
	}
}

// readChunk reads bytes [off, off+n) of source i into buf behind their
// frame and chunk headers (with the CRC32C) and returns the frame; false
// when the read failed (readErr is set and the transfer halts).
func (sd *sender) readChunk(buf []byte, i int, off, n int64) ([]byte, bool) {
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
		return nil, false
	}
	putFrameHeader(buf, frameData, dataHeaderLen+int(n))
	putChunkHeader(buf[frameHeaderLen:], chunkHeader{index: uint32(i), offset: off, crc: crc32.Checksum(data, crcTable)})
	return buf[:frameOverhead+n], true
}

// produce packs the frames of the next chunks into buf, as many as fit,
// each at a multiple of frameAlign (so that its chunk's bytes are aligned:
// see bufPad), for an inline writer; it returns them in frames (reused)
// and how many bytes they carry, or false when the chunks ran out before
// one was packed, a read failed (readErr) or the transfer halted.
func (sd *sender) produce(buf []byte, frames [][]byte) (_ [][]byte, bytes int64, ok bool) {
	frames = frames[:0]
	pos := 0
	for pos+frameOverhead+sd.maxChunk <= len(buf) || pos == 0 {
		select {
		case <-sd.stop:
			return frames, 0, false
		default:
		}
		i, off, n, more := sd.next()
		if !more {
			break
		}
		f, ok := sd.readChunk(buf[pos:], i, off, n)
		if !ok {
			return frames, 0, false
		}
		frames = append(frames, f)
		bytes += n
		pos = (pos + len(f) + frameAlign - 1) &^ (frameAlign - 1)
	}
	return frames, bytes, len(frames) > 0
}

// frameAlign is the alignment of the frames an inline writer packs into
// its buffer, in bytes (see bufPad).
const frameAlign = 32

// chunks yields what a writer sends, frames and the chunk bytes they
// carry: one frame at a time from the readers (full), or, inline, the
// frames read by the writer itself into one buffer of its own.
func (sd *sender) chunks(yield func([][]byte, int64) bool) {
	if !sd.inline {
		var one [1][]byte
		for buf := range sd.full {
			one[0] = buf
			if !yield(one[:], int64(len(buf)-frameOverhead)) {
				for range sd.full {
				}
				return
			}
		}
		return
	}
	buf := <-sd.free
	defer func() { sd.free <- buf }()
	var frames [][]byte
	for !sd.ss.failed.Load() {
		var n int64
		var ok bool
		frames, n, ok = sd.produce(buf[:cap(buf)], frames)
		if !ok || !yield(frames, n) {
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
	for frames, n := range sd.chunks {
		if sd.ss.failed.Load() {
			continue
		}
		if err := c.writeFrames(frames); err != nil {
			sd.ss.fail(netErr(err))
			sd.halt()
			continue
		}
		chunks += int64(len(frames))
		sd.rec.BytesDone.Add(n)
		if !sd.inline {
			sd.free <- frames[0][:cap(frames[0])]
		}
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
// says joins always delivers want items (the client's own joins). It
// returns the extra streams, to be released whatever the outcome.
func (s *Service) sendChunks(first *conn, joins <-chan joined, want int, all bool, srcs []Source, chunk int, rec *Record, onFail func(error)) ([]*stream, error) {
	ss := &streamSet{dead: make(chan struct{}), onFail: onFail}
	k := 1 + want
	sd := newSender(srcs, int64(chunk), k, rec, ss)
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
	for b := range sd.full { // the readers stop; wait for them before the sources close
		sd.free <- b[:cap(b)]
	}
	sd.release()
	extras, err := ss.result()
	if err == nil && sd.readErr != nil {
		err = sd.readErr
	}
	return extras, err
}
