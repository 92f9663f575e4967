package transfer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// Send copies srcs (the tensors at a local path; isDir when that path is a
// directory) to remotePath on peer, and returns how many tensors were put in
// place. It returns when the peer has committed them all, or with an error
// carrying an errno (see dial; EIO for a broken stream or a CRC mismatch).
// A peer on the same host (same host id) copies from this daemon's exported
// memory directly (path "ipc"), when every source is exported host memory;
// anything else goes over TCP.
//
// The caller keeps ownership of srcs (Send does not close them).
func (s *Service) Send(ctx context.Context, peer, remotePath string, srcs []Source, isDir bool, src string) (n int, err error) {
	remotePath, err = CleanPath(remotePath)
	if err != nil {
		return 0, err
	}
	metas := make([]Meta, len(srcs))
	var total int64
	for i, sc := range srcs {
		metas[i] = sc.Meta()
		total += metas[i].NBytes
	}
	c, err := s.conn(ctx, peer)
	if err != nil {
		_, end := s.Track(src, peer+":"+remotePath, "tcp", total, int64(len(srcs)))
		end(err)
		return 0, err
	}
	stop := context.AfterFunc(ctx, func() { c.c.Close() })
	defer func() { s.done(peer, c, stop(), err) }()
	if s.sameHost(c) {
		lc := s.leaseChannel(ctx, peer, c)
		if descs, release, ok := s.exports(srcs, c, lc); ok {
			rec, end := s.Track(src, peer+":"+remotePath, "ipc", total, int64(len(srcs)))
			err := c.sendJSON(frameRequest, request{Op: "put", Path: remotePath, Dir: isDir, Tensors: metas, IPC: descs})
			var r reply
			if err == nil {
				err = c.recvJSON(frameOK, &r)
			} else {
				err = netErr(err)
			}
			release()
			if !errors.Is(err, syscall.EXDEV) {
				if err == nil {
					rec.BytesDone.Store(total)
				}
				end(err)
				return r.Copied, err
			}
			end(err) // the peer cannot reach this daemon's memory: TCP then
		}
	}
	rec, end := s.Track(src, peer+":"+remotePath, "tcp", total, int64(len(srcs)))
	n, err = s.send(c, remotePath, srcs, metas, isDir, rec)
	end(err)
	return n, err
}

// sameHost reports whether the peer of c runs on this host: it says so (its
// host id is ours) and the connection comes from an address of this machine
// (a loopback address, or the one it reached us on), so a remote peer that
// claims our host id cannot make us read local memory for it.
func (s *Service) sameHost(c *conn) bool {
	if s.cfg.HostID == "" || c.hostID != s.cfg.HostID {
		return false
	}
	r, rok := c.c.RemoteAddr().(*net.TCPAddr)
	l, lok := c.c.LocalAddr().(*net.TCPAddr)
	return rok && lok && (r.IP.IsLoopback() || r.IP.Equal(l.IP))
}

func (s *Service) send(c *conn, remotePath string, srcs []Source, metas []Meta, isDir bool, rec *Record) (int, error) {
	if err := c.sendJSON(frameRequest, request{Op: "put", Path: remotePath, Dir: isDir, Tensors: metas}); err != nil {
		return 0, netErr(err)
	}
	if err := c.recvJSON(frameOK, nil); err != nil {
		return 0, err
	}
	// The destination may fail part-way (ENOSPC, a bad chunk): its error
	// frame is read while the data still goes out, so the sender stops and
	// reports it instead of a broken pipe. The read has no deadline while
	// sending (the destination says nothing until the end); once the data is
	// out, the usual timeout applies.
	type result struct {
		r   reply
		err error
	}
	res := make(chan result, 1)
	var sent atomic.Bool // the data is out: silence now counts against the timeout
	c.c.SetReadDeadline(time.Time{})
	go func() {
		var r reply
		typ, p, err := readFrame(c.r, nil, c.max)
		for err == nil && typ == frameKeepalive {
			if sent.Load() {
				c.c.SetReadDeadline(time.Now().Add(s.cfg.Timeout))
			}
			typ, p, err = readFrame(c.r, nil, c.max)
		}
		switch {
		case err != nil:
			res <- result{err: netErr(err)}
		case typ == frameError:
			res <- result{err: wireToError(c.peer, p)}
		case typ != frameOK || json.Unmarshal(p, &r) != nil:
			res <- result{err: &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: unexpected frame %d", c.peer, typ)}}
		default:
			res <- result{r: r}
		}
	}()
	sendErr := make(chan error, 1)
	go func() { sendErr <- s.sendTensors(c, srcs, rec) }()
	select {
	case r := <-res:
		c.c.Close() // stops the sender if it is still going
		<-sendErr
		if r.err != nil {
			return 0, r.err
		}
		return r.r.Copied, nil
	case err := <-sendErr:
		if err != nil {
			c.c.SetReadDeadline(time.Now().Add(s.cfg.Timeout))
			// Prefer the destination's own reason, if it sent one in time.
			select {
			case r := <-res:
				if r.err != nil {
					return 0, r.err
				}
			case <-time.After(100 * time.Millisecond):
			}
			c.c.Close()
			return 0, err
		}
		sent.Store(true)
		c.c.SetReadDeadline(time.Now().Add(s.cfg.Timeout))
		r := <-res
		if r.err != nil {
			return 0, r.err
		}
		return r.r.Copied, nil
	}
}

// Receive copies the tensors at remotePath on peer into this node: prepare
// gets their metadata (and whether remotePath is a directory) and returns
// where to write them; Receive commits the Dest when every byte has arrived
// intact, and aborts it otherwise. It returns how many tensors were placed.
// From a peer on the same host it reads the peer's exported memory directly
// (path "ipc") when the peer offers it.
func (s *Service) Receive(ctx context.Context, peer, remotePath, dst string, prepare func(isDir bool, metas []Meta) (Dest, error)) (n int, err error) {
	remotePath, err = CleanPath(remotePath)
	if err != nil {
		return 0, err
	}
	c, err := s.conn(ctx, peer)
	if err != nil {
		_, end := s.Track(peer+":"+remotePath, dst, "tcp", 0, 0)
		end(err)
		return 0, err
	}
	stop := context.AfterFunc(ctx, func() { c.c.Close() })
	defer func() { s.done(peer, c, stop(), err) }()
	ipcOK := s.sameHost(c)
	if ipcOK {
		// The peer leases what it exports to us on this channel, so that we
		// can keep the imports open for the next copy.
		s.leaseChannel(ctx, peer, c)
	}
	for {
		var retry bool
		n, retry, err = s.receive(c, peer, remotePath, dst, prepare, ipcOK)
		if retry {
			ipcOK = false // the peer's memory is out of reach: ask again over TCP
			continue
		}
		return n, err
	}
}

// receive runs one get on c; retry says the IPC copy could not start and the
// request should be made again without it.
func (s *Service) receive(c *conn, peer, remotePath, dst string, prepare func(bool, []Meta) (Dest, error), ipcOK bool) (n int, retry bool, err error) {
	if err := c.sendJSON(frameRequest, request{Op: "get", Path: remotePath, IPCOK: ipcOK}); err != nil {
		return 0, false, netErr(err)
	}
	var r reply
	if err := c.recvJSON(frameOK, &r); err != nil {
		return 0, false, err
	}
	path := "tcp"
	if len(r.IPC) > 0 {
		path = "ipc"
	}
	var total int64
	for _, m := range r.Tensors {
		total += m.NBytes
	}
	rec, end := s.Track(peer+":"+remotePath, dst, path, total, int64(len(r.Tensors)))
	defer func() { end(err) }()
	if err := checkMetas(r.Tensors, r.Dir); err != nil {
		return 0, false, err
	}
	if path == "ipc" && len(r.IPC) != len(r.Tensors) {
		return 0, false, &Error{Errno: syscall.EPROTO, Msg: "ipc descriptors do not match the tensors"}
	}
	var entries []*importEntry
	if path == "ipc" {
		if entries, err = s.importAll(c, r.IPC); err != nil {
			// Tell the peer to release its pins, then ask again over TCP.
			c.sendError(&Error{Errno: syscall.EXDEV, Msg: err.Error()})
			return 0, true, nil
		}
		defer s.releaseAll(entries)
	}
	dest, err := prepare(r.Dir, r.Tensors)
	if err != nil {
		if path == "ipc" {
			c.sendError(err)
		}
		return 0, false, err
	}
	if path == "ipc" {
		err = c.whileSilent(func() error { return copyExports(entries, r.IPC, r.Tensors, dest, s.cfg.ChunkSize, rec) })
		if err != nil {
			c.sendError(err)
		} else {
			err = c.sendJSON(frameDone, doneMsg{})
		}
	} else {
		err = s.recvTensors(c, dest, r.Tensors, rec)
	}
	if err != nil {
		dest.Abort()
		return 0, false, err
	}
	n, err = dest.Commit()
	return n, false, err
}

// servePut receives a copy into this node.
func (s *Service) servePut(c *conn, req request) error {
	if err := checkMetas(req.Tensors, req.Dir); err != nil {
		c.sendError(err)
		return err
	}
	var total int64
	for _, m := range req.Tensors {
		total += m.NBytes
	}
	rec, end := s.Track(c.peer, req.Path, "tcp", total, int64(len(req.Tensors)))
	if len(req.IPC) > 0 {
		return s.servePutIPC(c, req)
	}
	var dest Dest
	err := c.whileSilent(func() (err error) {
		dest, err = s.local.Put(req.Path, req.Dir, req.Tensors)
		return err
	})
	if err != nil {
		end(err)
		c.sendError(err)
		return err
	}
	if err := c.sendJSON(frameOK, reply{}); err != nil {
		dest.Abort()
		end(err)
		return netErr(err)
	}
	if err := s.recvTensors(c, dest, req.Tensors, rec); err != nil {
		dest.Abort()
		end(err)
		c.sendError(err)
		if !isNetErr(err) {
			// Tell the sender why, then discard what it still sends until it
			// stops, so the connection stays in step for the next request.
			drain(c)
		}
		return err
	}
	var n int
	err = c.whileSilent(func() (err error) {
		n, err = dest.Commit()
		return err
	})
	end(err)
	if err != nil {
		c.sendError(&Error{Errno: Errno(err), Msg: err.Error(), Copied: n})
		return err
	}
	return c.sendJSON(frameOK, reply{Copied: n})
}

// servePutIPC receives a copy from a daemon of this host by reading its
// exported memory; EXDEV when that memory is out of reach (the client then
// sends the bytes over TCP).
func (s *Service) servePutIPC(c *conn, req request) error {
	if !s.sameHost(c) || len(req.IPC) != len(req.Tensors) {
		err := &Error{Errno: syscall.EXDEV, Msg: "not a daemon of this host"}
		c.sendError(err)
		return err
	}
	entries, err := s.importAll(c, req.IPC)
	if err != nil {
		err := &Error{Errno: syscall.EXDEV, Msg: err.Error()}
		c.sendError(err)
		return err
	}
	defer s.releaseAll(entries)
	var total int64
	for _, m := range req.Tensors {
		total += m.NBytes
	}
	rec, end := s.Track(c.peer, req.Path, "ipc", total, int64(len(req.Tensors)))
	var n int
	err = c.whileSilent(func() error {
		dest, err := s.local.Put(req.Path, req.Dir, req.Tensors)
		if err != nil {
			return err
		}
		if err := copyExports(entries, req.IPC, req.Tensors, dest, s.cfg.ChunkSize, rec); err != nil {
			dest.Abort()
			return err
		}
		n, err = dest.Commit()
		return err
	})
	end(err)
	if err != nil {
		c.sendError(&Error{Errno: Errno(err), Msg: err.Error(), Copied: n})
		return err
	}
	return c.sendJSON(frameOK, reply{Copied: n})
}

// serveGet sends the tensors at a path of this node.
func (s *Service) serveGet(c *conn, req request) error {
	srcs, isDir, err := s.local.Get(req.Path)
	if err != nil {
		c.sendError(err)
		return err
	}
	defer func() {
		for _, sc := range srcs {
			sc.Close()
		}
	}()
	metas := make([]Meta, len(srcs))
	var total int64
	for i, sc := range srcs {
		metas[i] = sc.Meta()
		total += metas[i].NBytes
	}
	if req.IPCOK && s.sameHost(c) {
		if descs, release, ok := s.exports(srcs, c, s.chanTo(c.instance)); ok {
			// The client reads our memory while we hold the pins and
			// leases, until it says done (or fails).
			defer release()
			rec, end := s.Track(req.Path, c.peer, "ipc", total, int64(len(srcs)))
			if err := c.sendJSON(frameOK, reply{Dir: isDir, Tensors: metas, IPC: descs}); err != nil {
				end(err)
				return netErr(err)
			}
			err := c.recvJSON(frameDone, nil)
			if err == nil {
				rec.BytesDone.Store(total)
			}
			end(err)
			var te *Error
			if errors.As(err, &te) && !te.broken {
				return nil // the client's own failure; the connection is fine
			}
			return err
		}
	}
	rec, end := s.Track(req.Path, c.peer, "tcp", total, int64(len(srcs)))
	if err := c.sendJSON(frameOK, reply{Dir: isDir, Tensors: metas}); err != nil {
		end(err)
		return netErr(err)
	}
	err = s.sendTensors(c, srcs, rec)
	end(err)
	return err
}

// sendTensors streams every source in chunks (pipelined: no per-chunk
// acknowledgement; TCP's window keeps the pipe full), then a done frame.
func (s *Service) sendTensors(c *conn, srcs []Source, rec *Record) error {
	// A reader goroutine fills chunks (device to host for GPU tensors, and
	// the CRC) while this one writes the previous ones to the socket: three
	// buffers keep both busy.
	type chunk struct {
		buf []byte
		err error
	}
	// Buffers no larger than the largest tensor: a 4 KiB copy should not
	// allocate (and collect) megabytes.
	size := int64(1)
	for _, sc := range srcs {
		size = max(size, min(sc.Meta().NBytes, int64(s.cfg.ChunkSize)))
	}
	free := make(chan []byte, 3)
	for range cap(free) {
		free <- make([]byte, dataHeaderLen+size)
	}
	full := make(chan chunk, cap(free)+1) // room for an error after every buffer
	stop := make(chan struct{})
	defer func() {
		// Stop the reader and wait for it: the caller closes the sources
		// when this returns.
		close(stop)
		for range full {
		}
	}()
	go func() {
		defer close(full)
		for i, sc := range srcs {
			size := sc.Meta().NBytes
			for off := int64(0); off < size; {
				var buf []byte
				select {
				case buf = <-free:
				case <-stop:
					return
				}
				n := min(int64(s.cfg.ChunkSize), size-off)
				data := buf[dataHeaderLen : dataHeaderLen+n]
				if _, err := sc.ReadAt(data, off); err != nil {
					full <- chunk{err: fmt.Errorf("read %s at %d: %w", sc.Meta().Rel, off, err)}
					return
				}
				putChunkHeader(buf, chunkHeader{index: uint32(i), offset: off, crc: crc32.Checksum(data, crcTable)})
				full <- chunk{buf: buf[:dataHeaderLen+n]}
				off += n
			}
		}
	}()
	var chunks int64
	for ch := range full {
		if ch.err != nil {
			c.sendError(ch.err)
			return ch.err
		}
		if err := c.send(frameData, ch.buf); err != nil {
			return netErr(err)
		}
		chunks++
		rec.BytesDone.Add(int64(len(ch.buf) - dataHeaderLen))
		free <- ch.buf[:cap(ch.buf)]
	}
	if err := c.sendJSON(frameDone, doneMsg{Chunks: chunks}); err != nil {
		return netErr(err)
	}
	return nil
}

// recvTensors writes incoming chunks into dest until the done frame, and
// checks that every byte of every tensor arrived exactly once and intact.
func (s *Service) recvTensors(c *conn, dest Dest, metas []Meta, rec *Record) error {
	got := make([]int64, len(metas))
	var chunks int64
	for {
		typ, p, err := c.recv()
		if err != nil {
			return netErr(err)
		}
		switch typ {
		case frameData:
			h, data, err := parseChunk(p)
			if err != nil {
				return netErr(err)
			}
			if int(h.index) >= len(metas) || h.offset > metas[h.index].NBytes-int64(len(data)) {
				return &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: chunk [%d, +%d) of tensor %d is outside it", c.peer, h.offset, len(data), h.index)}
			}
			if h.offset != got[h.index] {
				// Chunks of a tensor come in order; anything else would leave
				// holes or write twice.
				return &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: chunk at %d of %q, expected %d", c.peer, h.offset, metas[h.index].Rel, got[h.index])}
			}
			if crc32.Checksum(data, crcTable) != h.crc {
				return &Error{Errno: syscall.EIO, Msg: fmt.Sprintf("%s: CRC32C mismatch in %q at %d", c.peer, metas[h.index].Rel, h.offset)}
			}
			if err := dest.WriteAt(int(h.index), data, h.offset); err != nil {
				return err
			}
			got[h.index] += int64(len(data))
			chunks++
			rec.BytesDone.Add(int64(len(data)))
		case frameDone:
			for i, m := range metas {
				if got[i] != m.NBytes {
					return &Error{Errno: syscall.EIO, Msg: fmt.Sprintf("%s: %q: %d of %d bytes arrived", c.peer, m.Rel, got[i], m.NBytes)}
				}
			}
			return nil
		case frameError:
			return wireToError(c.peer, p)
		default:
			return &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: frame type %d in a data stream", c.peer, typ)}
		}
	}
}

// isNetErr reports whether err is the connection's failure (nothing more
// can be said on it) rather than a refusal the peer should hear.
func isNetErr(err error) bool {
	var te *Error
	return errors.As(err, &te) && te.broken
}

// drain discards frames until the sender's done frame or the connection's
// end (bounded by the timeout of each read).
func drain(c *conn) {
	for {
		typ, _, err := c.recv()
		if err != nil || typ == frameDone {
			return
		}
	}
}

// checkMetas validates a peer's tensor list: relative paths without "..",
// non-negative sizes, one tensor with Rel "" for a file copy.
func checkMetas(metas []Meta, isDir bool) error {
	if !isDir && (len(metas) != 1 || metas[0].Rel != "") {
		return &Error{Errno: syscall.EPROTO, Msg: "a file copy carries exactly one tensor"}
	}
	seen := map[string]bool{}
	for _, m := range metas {
		if m.NBytes < 0 {
			return &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("tensor %q of %d bytes", m.Rel, m.NBytes)}
		}
		if isDir {
			if _, err := CleanRel(m.Rel); err != nil || seen[m.Rel] {
				return &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("tensor path %q", m.Rel)}
			}
			seen[m.Rel] = true
		}
	}
	return nil
}
