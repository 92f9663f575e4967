package transfer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Send copies srcs (the tensors at a local path; isDir when that path is a
// directory) to remotePath on peer, and returns how many tensors were put in
// place. It returns when the peer has committed them all, or with an error
// carrying an errno (see dial; EIO for a broken stream or a checksum mismatch).
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
	metas, err := sendMetas(srcs)
	if err != nil {
		return 0, err
	}
	total := metaBytes(metas)
	dst := peer + ":" + remotePath
	if len(metas) == 1 && metas[0].InPlace && metas[0].Spans == nil {
		// The record names the range it writes, as the line did.
		dst += Range{Set: true, Off: metas[0].Off, Len: metas[0].NBytes, HasLen: true}.String()
	}
	c, err := s.conn(ctx, peer)
	if err != nil {
		_, end := s.TrackCtx(ctx, src, dst, "tcp", metas)
		end(err)
		return 0, err
	}
	stop := closeOnDone(ctx, c)
	defer func() { s.done(peer, c, stop(), err) }()
	if s.sameHost(c) {
		if n, ok, err := s.pushBound(ctx, c, remotePath, srcs, metas, isDir, src, dst); ok {
			return n, err
		}
		lc := s.leaseChannel(ctx, peer, c)
		if descs, release, ok := s.exports(srcs, c, lc); ok {
			rec, end := s.TrackCtx(ctx, src, dst, "ipc", metas)
			err := c.sendJSON(frameRequest, request{Op: "put", Path: remotePath, Dir: isDir, Tensors: metas, IPC: descs})
			var r reply
			if err == nil {
				c.progress = func(n int64) { rec.BytesDone.Store(min(max(n, 0), total)) }
				err = c.recvJSON(frameOK, &r)
				c.progress = nil
			} else {
				err = netErr(err)
			}
			release()
			if !errors.Is(err, syscall.EXDEV) {
				if err == nil {
					rec.BytesDone.Store(total)
				}
				end(err)
				if paths, can := boundPaths(remotePath, srcs, metas, isDir); can && err == nil {
					// The next copies there go one-sided.
					for _, p := range paths {
						s.askBind(lc, p)
					}
				}
				return r.Copied, err
			}
			end(err) // the peer cannot reach this daemon's memory: TCP then
		}
	}
	p, err := s.rmaFor(peer, c)
	if err != nil {
		_, end := s.TrackCtx(ctx, src, dst, "ucx", metas)
		end(err)
		return 0, err
	}
	if p != nil && total > 0 {
		rec, end := s.TrackCtx(ctx, src, dst, "ucx", metas)
		trackVia(rec, p)
		chunk := s.chunkFor(total)
		req := request{Op: "put", Path: remotePath, Dir: isDir, Tensors: metas, Streams: s.cfg.Streams, Chunk: chunk}
		n, ok, err := s.rmaPush(c, srcs, metas, req, rec)
		if !errors.Is(err, errNoRMA) {
			end(err)
			return n, err
		}
		end(err) // a peer that read nothing one-sided: its go-ahead stands
		rec, end = s.TrackCtx(ctx, src, dst, "tcp", metas)
		n, err = s.pushData(ctx, peer, c, *ok, false, srcs, chunk, false, rec)
		end(err)
		return n, err
	}
	for recheck := s.recheckFor(c); ; recheck = false {
		rec, end := s.TrackCtx(ctx, src, dst, "tcp", metas)
		n, err = s.send(ctx, peer, c, remotePath, srcs, metas, isDir, recheck, rec)
		end(err)
		if !recheck || !isRecheck(err) {
			return n, err
		}
		if err = s.rerun(ctx, peer, src, dst, metas, &c, &stop, err); err != nil {
			return 0, err
		}
	}
}

// rerun starts the second run of a copy from src to dst whose chunk
// failed its sum where its bytes lie (why, request.Recheck): it logs and
// counts it, and gives it a new connection to peer, since the failed one
// is out of step: it closes *c and puts the new one and its closeOnDone
// in *c and *stop. On failure (the dial's error, in a record of its own)
// *c is left, closed, for the copy's deferred release.
func (s *Service) rerun(ctx context.Context, peer, src, dst string, metas []Meta, c **conn, stop *func() bool, why error) error {
	slog.Warn(recheckLog, "src", src, "dst", dst, "err", why)
	s.rechecks.Add(1)
	(*stop)()
	(*c).c.Close()
	nc, err := s.conn(ctx, peer)
	if err != nil {
		_, end := s.TrackCtx(ctx, src, dst, "tcp", metas)
		end(err)
		return err
	}
	*c, *stop = nc, closeOnDone(ctx, nc)
	return nil
}

// recheckLog is the log line of a copy that runs again from buffers
// (rerun).
const recheckLog = "a chunk failed its sum where its bytes lie (a process writing the source or the destination, or another copy into them, can do that): the copy runs again from buffers"

// closeOnDone closes c when ctx is done, until the returned stop (whose
// result says whether ctx was still live) runs: a cancelled copy stops.
func closeOnDone(ctx context.Context, c *conn) (stop func() bool) {
	return context.AfterFunc(ctx, func() { c.c.Close() })
}

// goAheadMin is the bytes above which a TCP get of whole tensors waits for
// the puller's go-ahead (reply.WaitGo), whatever its streams.
const goAheadMin = 1 << 20

// sendMetas is the descriptors of srcs as a put sends them. Errors: EINVAL
// for a destination range, or a range list's span, that ends past 2^63
// (refused here, with the peer's own span check, checkSpans: the peer
// would take it for a broken request, EPROTO).
func sendMetas(srcs []Source) ([]Meta, error) {
	metas := make([]Meta, len(srcs))
	for i, sc := range srcs {
		m := sc.Meta()
		metas[i] = m
		if m.InPlace && (m.Off < 0 || m.Off > math.MaxInt64-m.NBytes) {
			return nil, &Error{Errno: syscall.EINVAL, Msg: fmt.Sprintf("destination range at %d of %d bytes ends past 2^63", m.Off, m.NBytes)}
		}
		if m.Spans != nil {
			if err := checkSpans(m.Spans, m.NBytes); err != nil {
				return nil, &Error{Errno: syscall.EINVAL, Msg: "a range list past 2^63: " + err.Error()}
			}
		}
	}
	return metas, nil
}

// drainEager reads an eager put's data frames (they follow its request
// in one write) up to its done frame. Errors: the connection's, ErrFrame
// for another frame.
func (c *conn) drainEager() error {
	for {
		typ, _, err := c.recv()
		switch {
		case err != nil:
			return netErr(err)
		case typ == frameDone:
			return nil
		case typ != frameData:
			return fmt.Errorf("%s: frame %d in an eager put's data: %w", c.peer, typ, ErrFrame)
		}
	}
}

// refuseTCP is why a copy the peer of c asked for may not move its bytes
// on TCP: this node runs with --transport ucx (Config.RMARequired) and
// the peer is on another host; nil otherwise (callers let a copy of no
// bytes pass: there is nothing to move). Errors: EPROTONOSUPPORT.
func (s *Service) refuseTCP(c *conn) error {
	if !s.cfg.RMARequired || s.sameHost(c) {
		return nil
	}
	return &Error{Errno: syscall.EPROTONOSUPPORT, Msg: fmt.Sprintf("%s asked for a copy over TCP, and this daemon runs with --transport ucx (no UCX endpoint between them that carries copies)", c.peer)}
}

// rmaFor is the endpoint a copy with the peer of c moves its bytes on,
// nil for TCP: the peer's RMA endpoint, when this node has an RMA
// transport, the peer offered one at its handshake and the endpoint
// carries copies (one-sided and detecting a dead peer, or any with
// Config.RMAAnyEndpoint).
// Errors: EPROTONOSUPPORT when this node must use RMA
// (Config.RMARequired) and the peer offers none, or no endpoint that
// carries copies.
func (s *Service) rmaFor(peer string, c *conn) (*rmaPeer, error) {
	p := s.rmaTo(peer, c.instance)
	switch {
	case s.carries(p):
		return p, nil
	case !s.cfg.RMARequired:
		return nil, nil
	case p != nil:
		return nil, &Error{Errno: syscall.EPROTONOSUPPORT, Msg: fmt.Sprintf("the UCX endpoint to %s (%s) %s, and this daemon runs with --transport ucx (auto would use TCP; --ucx-any-endpoint would use the endpoint)", peer, strings.Join(p.transports, ", "), p.unguarded())}
	}
	return nil, &Error{Errno: syscall.EPROTONOSUPPORT, Msg: fmt.Sprintf("%s offers no UCX endpoint, and this daemon runs with --transport ucx (auto would use TCP)", peer)}
}

// sameHost reports whether the peer of c runs on this host: it says so (its
// host id is ours) and the connection comes from this machine: a unix
// socket, a loopback address, or the one it reached us on; so a remote
// peer that claims our host id cannot make us read local memory for it.
func (s *Service) sameHost(c *conn) bool {
	if s.cfg.HostID == "" || c.hostID != s.cfg.HostID {
		return false
	}
	if _, ok := c.c.Conn.(*net.UnixConn); ok {
		return true
	}
	r, rok := c.c.RemoteAddr().(*net.TCPAddr)
	l, lok := c.c.LocalAddr().(*net.TCPAddr)
	return rok && lok && (r.IP.IsLoopback() || r.IP.Equal(l.IP))
}

// checksumFor is the checksum a copy's chunks on c carry, both ways
// (checksumWith: this node's Config.Checksum and what the peer said in the
// handshake).
func (s *Service) checksumFor(c *conn) Checksum {
	return checksumWith(s.cfg.Checksum, c.noChecksum, c.xxh3)
}

// recheckFor says whether a TCP copy with the peer on c may be summed
// where its bytes lie (request.Recheck): when its chunks carry a sum and
// the peer said it takes such copies (hello.Recheck).
func (s *Service) recheckFor(c *conn) bool {
	return c.recheck && s.checksumFor(c) != ChecksumNone
}

// send runs one put on c over TCP: the request, then the data over c and
// the extra streams the peer takes (their connections go back to the idle
// pool after a success), then the peer's reply once it has committed. A
// put of one stream up to eagerMax, and every put of several (Early,
// joining with a token of its own), sends its data without waiting for a
// go-ahead.
func (s *Service) send(ctx context.Context, peer string, c *conn, remotePath string, srcs []Source, metas []Meta, isDir, recheck bool, rec *Record) (int, error) {
	total := rec.BytesTotal.Load()
	chunk := s.chunkFor(total)
	req := request{Op: "put", Path: remotePath, Dir: isDir, Tensors: metas, Streams: s.cfg.Streams, Chunk: chunk, Recheck: recheck}
	if k := streamsFor(total, s.cfg.Streams, chunk); k > 1 {
		req.Early, req.Token = true, nonce()
		if err := c.sendJSON(frameRequest, req); err != nil {
			return 0, netErr(err)
		}
		return s.pushData(ctx, peer, c, reply{Streams: k, Token: req.Token}, true, srcs, chunk, recheck, rec)
	}
	eager := eagerPut(total, s.cfg.Streams, chunk)
	if eager {
		sd := newSender(srcs, int64(chunk), 1, s.checksumFor(c), req.Recheck, rec, &streamSet{dead: make(chan struct{})})
		if sd.inline {
			defer sd.release()
			return s.sendSmall(c, req, sd)
		}
		sd.release()
	}
	if err := c.sendJSON(frameRequest, req); err != nil {
		return 0, netErr(err)
	}
	var ok reply
	if !eager {
		if err := c.recvJSON(frameOK, &ok); err != nil {
			return 0, err
		}
	}
	return s.pushData(ctx, peer, c, ok, false, srcs, chunk, recheck, rec)
}

// pushData sends a put's data, after its request and the destination's
// answer ok (zero for an eager put; the streams and token of its own for
// an early one), over c and the extra streams ok takes, then reads the
// reply the destination sends once it committed. recheck: the request's
// Recheck.
func (s *Service) pushData(ctx context.Context, peer string, c *conn, ok reply, early bool, srcs []Source, chunk int, recheck bool, rec *Record) (int, error) {
	want := 0
	var joins <-chan joined
	if ok.Streams > 1 {
		want = min(ok.Streams, MaxStreams) - 1
		joins = s.joinStreams(ctx, peer, ok.Token, want, early)
	}
	// The destination may fail part-way (ENOSPC, a bad chunk): its error
	// frame is read while the data still goes out, so the sender stops and
	// reports it instead of a broken pipe.
	var sent atomic.Bool // the data is out: silence now counts against the timeout
	c.c.SetReadDeadline(time.Time{})
	res := c.awaitReply(&sent)
	sendErr := make(chan sendResult, 1)
	go func() {
		extras, err := s.sendChunks(c, joins, want, true, srcs, chunk, recheck, rec, nil)
		sendErr <- sendResult{extras, err}
	}()
	select {
	case rr := <-res:
		return s.replyFirst(peer, c, rr, sendErr)
	case sr := <-sendErr:
		return s.sentFirst(peer, c, sr, res, &sent)
	}
}

// sendSmall runs a put whose data is small chunks (sender.inline) that go
// right behind the request (eagerPut) on this goroutine: the request, the
// chunks and the done frame in one write, then the reply. No goroutine is
// started and no other wakes up: a KV block's copy is one round trip.
func (s *Service) sendSmall(c *conn, req request, sd *sender) (int, error) {
	close(sd.full) // no readers: the writer reads
	if err := c.send(frameRequest, c.encode(req)); err != nil {
		return 0, netErr(err)
	}
	if !sd.write(c) {
		// The destination may have refused the put and hung up: its
		// reason, if it came, beats the broken pipe.
		c.c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if typ, p, err := readFrame(c.r, c.buf, c.max); err == nil && typ == frameError {
			return 0, wireToError(c.peer, p)
		}
		c.c.Close()
		_, err := sd.ss.result()
		return 0, err
	}
	var r reply
	err := c.recvJSON(frameOK, &r)
	if sd.readErr != nil { // the source failed: the destination's answer is about that
		return 0, sd.readErr
	}
	if err != nil {
		return 0, err
	}
	return r.Copied, nil
}

// pushReply is the destination's answer to a push: its reply, or why not.
type pushReply struct {
	r   reply
	err error
}

// sendResult is how a push's senders ended, with the extra streams to
// release.
type sendResult struct {
	extras []*stream
	err    error
}

// awaitReply reads the destination's reply to a push on c. The read has no
// deadline while the data goes out (the destination says nothing until the
// end); once sent is set, the usual timeout applies to each frame.
func (c *conn) awaitReply(sent *atomic.Bool) <-chan pushReply {
	res := make(chan pushReply, 1)
	go func() {
		typ, p, err := c.recvArmed(func() {
			if sent.Load() {
				c.c.SetReadDeadline(time.Now().Add(c.timeout))
			}
		})
		var r reply
		switch {
		case err != nil:
			res <- pushReply{err: netErr(err)}
		case typ == frameError:
			res <- pushReply{err: wireToError(c.peer, p)}
		case typ != frameOK || decodeMsg(p, &r) != nil:
			res <- pushReply{err: &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: unexpected frame %d", c.peer, typ)}}
		default:
			res <- pushReply{r: r}
		}
	}()
	return res
}

// replyFirst ends a push whose reply came before its senders returned.
func (s *Service) replyFirst(peer string, c *conn, rr pushReply, sendErr <-chan sendResult) (int, error) {
	// The reply can win the race against the senders' own return even when
	// every byte went out (a small copy committed by the peer before
	// sendChunks came back): a success waits for them, so that the
	// connections stay pooled in step. A refusal stops them.
	if rr.err == nil {
		select {
		case sr := <-sendErr:
			if sr.err == nil {
				s.releaseStreams(peer, sr.extras, nil)
				return rr.r.Copied, nil
			}
			c.c.Close()
			s.releaseStreams(peer, sr.extras, sr.err)
			return rr.r.Copied, nil
		case <-time.After(s.cfg.Timeout):
		}
	}
	c.c.Close() // stops the senders if they are still going
	sr := <-sendErr
	s.releaseStreams(peer, sr.extras, errors.New("stopped"))
	if rr.err != nil {
		return 0, rr.err
	}
	// The peer replied before taking all the data: its reply stands, but
	// none of the streams is in step any more.
	return rr.r.Copied, nil
}

// sentFirst ends a push whose senders returned before its reply came: on
// their failure, with the destination's own reason if it sends one in
// time; else with the reply, now under the timeout.
func (s *Service) sentFirst(peer string, c *conn, sr sendResult, res <-chan pushReply, sent *atomic.Bool) (int, error) {
	if sr.err != nil {
		s.releaseStreams(peer, sr.extras, sr.err)
		c.c.SetReadDeadline(time.Now().Add(s.cfg.Timeout))
		wait := 100 * time.Millisecond
		var te *Error
		if errors.As(sr.err, &te) && te.broken {
			// The streams broke: the destination failed and closed them
			// at once, and sends its reason on c after its abort (a
			// checksum that asks for the copy to run again, ENOSPC),
			// which may take longer; a dead one's c ends at once. Its
			// reason is the copy's error, not the broken pipe.
			wait = s.cfg.Timeout
		}
		select {
		case rr := <-res:
			if rr.err != nil {
				return 0, rr.err
			}
		case <-time.After(wait):
		}
		c.c.Close()
		return 0, sr.err
	}
	sent.Store(true)
	c.c.respin(time.Now().Add(s.cfg.Timeout))
	rr := <-res
	s.releaseStreams(peer, sr.extras, rr.err)
	if rr.err != nil {
		return 0, rr.err
	}
	return rr.r.Copied, nil
}

// Pull names what Receive copies: the tensors at Path on Peer (Range, when
// set, bytes of the tensor there) into Dst on this node (DstRange, when
// set, written in place: Range.Apply). Lists, instead of Path, Dst and both
// ranges, make it a range-list get: each list's spans of the peer's tensor
// at its Path written in place into the tensor at its Dst here, every list
// of the call in one transfer (one request, one reply, one stream of
// chunks or one IPC copy), as DESIGN.md's "one pipelined transfer per
// peer" asks. The peer sends back only what the spans ask for; where the
// bytes land here is this node's own list, never the peer's word.
type Pull struct {
	Peer, Path string
	Range      Range
	Dst        string
	DstRange   Range
	Lists      []SpanPull
}

// SpanPull is one list of a range-list Pull: span k's N bytes at Src in
// the peer's tensor at Path land at Dst in the tensor at Dst here (its Pos:
// laid end to end from 0 within the list). Path and Dst are paths in their
// mounts ("/kv/layer0"); several lists may name one tensor on either side.
type SpanPull struct {
	Path, Dst string
	Spans     []Span
}

// SrcText is how a record or a log names the source's bytes:
// "b:/kv@0+4096", or the first range list ("b:/kv@[64 ranges] and 3 more
// lists").
func (p Pull) SrcText() string {
	if p.Lists != nil {
		return listsText(p.Lists, func(l SpanPull) string { return p.Peer + ":" + l.Path })
	}
	return p.Peer + ":" + p.Path + p.Range.String()
}

// DstText is how a record or a log names the destination's bytes, as
// SrcText does the source's.
func (p Pull) DstText() string {
	if p.Lists != nil {
		return listsText(p.Lists, func(l SpanPull) string { return l.Dst })
	}
	return p.Dst + p.DstRange.String()
}

// listsText names range lists by their first one ("b:/kv@[64 ranges]"),
// with " and N more lists" when there are others.
func listsText(lists []SpanPull, name func(SpanPull) string) string {
	t := name(lists[0]) + Range{Spans: lists[0].Spans}.String()
	if len(lists) > 1 {
		t += fmt.Sprintf(" and %d more lists", len(lists)-1)
	}
	return t
}

// cleanPull is p checked and made canonical, as Receive and CheckPull
// send it: its paths cleaned, a range-list pull's lists checked and
// rooted at "/". Errors: EINVAL for a malformed path or list.
func cleanPull(p Pull) (Pull, error) {
	if p.Lists != nil {
		if p.Path != "" || p.Dst != "" || p.Range.Set || p.DstRange.Set || len(p.Lists) == 0 {
			return p, &Error{Errno: syscall.EINVAL, Msg: "a range-list pull names its tensors in its lists, and takes no other range"}
		}
		lists := make([]SpanPull, len(p.Lists))
		for i, l := range p.Lists {
			var err error
			if l.Path, err = CleanPath(l.Path); err != nil {
				return p, err
			}
			if l.Path == "/" || l.Dst == "" || len(l.Spans) == 0 {
				return p, &Error{Errno: syscall.EINVAL, Msg: fmt.Sprintf("range list %d: a tensor to pull from, one to write into and at least one range", i)}
			}
			if err := checkSpans(l.Spans, SpanEnd(l.Spans)); err != nil {
				return p, &Error{Errno: syscall.EINVAL, Msg: err.Error()}
			}
			lists[i] = l
		}
		// The lists' tensors travel as paths below the request's root.
		p.Path, p.Lists = "/", lists
	}
	var err error
	p.Path, err = CleanPath(p.Path)
	return p, err
}

// Receive copies what p names into this node: prepare gets the
// descriptors (and whether p.Path is a directory) and returns where to
// write them; Receive commits the Dest when every byte has arrived intact,
// and aborts it otherwise. It returns how many descriptors were placed.
// From a peer on the same host it reads the peer's exported memory directly
// (path "ipc") when the peer offers it. Errors: as Send's; EINVAL for a
// range that does not fit (Range.Apply, or outside the source).
func (s *Service) Receive(ctx context.Context, p Pull, prepare func(isDir bool, descs []Meta) (Dest, error)) (n int, err error) {
	if p, err = cleanPull(p); err != nil {
		return 0, err
	}
	peer := p.Peer
	c, err := s.conn(ctx, peer)
	if err != nil {
		_, end := s.TrackCtx(ctx, p.SrcText(), p.DstText(), "tcp", nil)
		end(err)
		return 0, err
	}
	stop := closeOnDone(ctx, c)
	defer func() { s.done(peer, c, stop(), err) }()
	ipcOK := s.sameHost(c)
	if ipcOK {
		// The peer leases what it exports to us on this channel, so that we
		// can keep the imports open for the next copy.
		s.leaseChannel(ctx, peer, c)
	}
	recheck := s.recheckFor(c)
	for {
		var retry bool
		n, retry, err = s.receive(ctx, c, p, prepare, ipcOK, recheck)
		switch {
		case retry: // err is the IPC attempt's, in its record
			ipcOK = false // the peer's memory is out of reach: ask again over TCP
			continue
		case recheck && isRecheck(err):
			recheck, ipcOK = false, false
			if err = s.rerun(ctx, peer, p.SrcText(), p.DstText(), nil, &c, &stop, err); err != nil {
				return 0, err
			}
			continue
		}
		return n, err
	}
}

// receive runs one get on c; retry says the IPC copy could not start (err
// says why) and the request should be made again without it. recheck: a
// TCP copy may be summed where its bytes lie (request.Recheck).
func (s *Service) receive(ctx context.Context, c *conn, p Pull, prepare func(bool, []Meta) (Dest, error), ipcOK, recheck bool) (n int, retry bool, err error) {
	rp, err := s.rmaFor(p.Peer, c)
	if err != nil && !ipcOK {
		_, end := s.TrackCtx(ctx, p.SrcText(), p.DstText(), "ucx", nil)
		end(err)
		return 0, false, err
	}
	err = nil // same host: the IPC copy needs no endpoint
	req := p.request("get")
	req.IPCOK, req.Streams, req.RMA, req.Recheck = ipcOK, s.cfg.Streams, rp != nil, recheck
	if err := c.sendJSON(frameRequest, req); err != nil {
		return 0, false, netErr(err)
	}
	var r reply
	if err := c.recvJSON(frameOK, &r); err != nil {
		return 0, false, err
	}
	path := "tcp"
	switch {
	case len(r.IPC) > 0:
		path = "ipc"
	case len(r.RMAAt) > 0 && rp != nil:
		path = "ucx"
	case len(r.RMAAt) > 0:
		return 0, false, &Error{Errno: syscall.EPROTO, Msg: "a one-sided answer to a get that asked for none"}
	}
	peer := p.Peer
	var descs []Meta
	var derr error
	if p.Lists != nil {
		descs, derr = spanDescs(r, p.Lists)
	} else if descs, derr = p.DstRange.Apply(r.Tensors, r.Dir); derr != nil {
		descs = r.Tensors
	}
	rec, end := s.TrackCtx(ctx, p.SrcText(), p.DstText(), path, descs)
	defer func() { end(err) }()
	if path == "ucx" {
		trackVia(rec, rp)
	}
	if p.Lists != nil {
		if derr != nil {
			// The peer's answer is not what was asked (spanDescs checks
			// it whole): out of step.
			return 0, false, derr
		}
	} else if err := checkMetas(r.Tensors, r.Dir); err != nil {
		return 0, false, err
	}
	if derr != nil {
		// The peer holds its pins until it hears from us.
		if path != "tcp" || r.WaitGo {
			c.sendError(derr)
		} else {
			c.c.Close()
		}
		return 0, false, derr
	}
	if path == "ipc" && len(r.IPC) != len(r.Tensors) {
		return 0, false, &Error{Errno: syscall.EPROTO, Msg: "ipc descriptors do not match the tensors"}
	}
	var entries, held []*importEntry
	if path == "ipc" {
		if entries, held, err = s.importAll(c, r.IPC); err != nil {
			// Tell the peer to release its pins, then ask again over TCP.
			// This attempt's record ends with the error (it is no ipc
			// copy); the TCP one has its own.
			err = &Error{Errno: syscall.EXDEV, Msg: err.Error()}
			c.sendError(err)
			return 0, true, err
		}
		defer s.releaseAll(held)
	}
	n, err = Deliver(rec, descs, func(descs []Meta) (dest Dest, err error) {
		prep := func() (err error) {
			dest, err = prepare(r.Dir, descs)
			return err
		}
		if path == "tcp" && !r.WaitGo {
			return dest, prep()
		}
		// The peer (ipc, ucx; tcp, for our go-ahead) waits for our done:
		// it must hear from us while we allocate (a large tensor's pages
		// are mapped now, seconds for GiBs on a loaded machine).
		if err = c.whileSilent(prep); err != nil {
			c.sendError(err)
		}
		return dest, err
	}, func(dest Dest, _ func()) error {
		switch path {
		case "tcp":
			if r.WaitGo {
				if err := c.sendJSON(frameOK, reply{}); err != nil {
					return netErr(err)
				}
			}
			return s.receiveTCP(c, peer, r, dest, recheck, rec)
		case "ucx":
			return s.rmaPullData(c, rp, r, descs, dest, rec)
		}
		err := c.whileSilent(func() error { return copyExports(entries, r.IPC, descs, dest, s.cfg.ChunkSize, rec, c.gone) })
		if err != nil {
			c.sendError(err)
			return err
		}
		return c.sendJSON(frameDone, doneMsg{})
	}, nil)
	return n, false, err
}

// request is the request of op ("get" or "check-get") for p (cleanPull's).
func (p Pull) request(op string) request {
	req := request{Op: op, Path: p.Path, InPlace: p.DstRange.Set || p.Lists != nil}
	if p.Range.Set {
		req.Range = &p.Range
	}
	if p.Lists != nil {
		// The spans travel in the request's table, as a put's do: one
		// descriptor a list, named by its tensor's path below the root.
		req.Tensors = make([]Meta, len(p.Lists))
		for i, l := range p.Lists {
			end := SpanEnd(l.Spans)
			req.Tensors[i] = Meta{Rel: l.Path[1:], DType: "U8", Shape: strconv.FormatInt(end, 10), NBytes: end, InPlace: true, Spans: l.Spans}
		}
	}
	return req
}

// spanDescs is the destination descriptors of a range-list pull: the
// peer's descriptors, one per list, which must be the spans asked for
// (Pos, Src, N), written in place at this node's own Dst offsets into the
// list's tensor (Rel: its path below the root). Errors: EPROTO for any
// other answer.
func spanDescs(r reply, lists []SpanPull) ([]Meta, error) {
	if r.Dir || len(r.Tensors) != len(lists) {
		return nil, &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("the peer's answer to a get of %d range lists is not those lists", len(lists))}
	}
	descs := make([]Meta, len(lists))
	for i, l := range lists {
		m := r.Tensors[i]
		if len(m.Spans) != len(l.Spans) || m.NBytes != SpanEnd(l.Spans) {
			return nil, &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("the peer's answer to range list %d (%s) is not the range list asked for", i, l.Path)}
		}
		for k, sp := range m.Spans {
			if sp.Pos != l.Spans[k].Pos || sp.Src != l.Spans[k].Src || sp.N != l.Spans[k].N {
				return nil, &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("the peer's span %d of range list %d (%s) is not the one asked for", k, i, l.Path)}
			}
		}
		m.Rel, m.InPlace, m.Off, m.Exact, m.Spans = strings.TrimPrefix(path.Clean("/"+l.Dst), "/"), true, 0, false, l.Spans
		descs[i] = m
	}
	return descs, nil
}

// servePut receives a copy into this node.
func (s *Service) servePut(c *conn, req request) error {
	if req.Early && len(req.Token) == nonceLen {
		// However the put ends, its streams that join after are
		// refused at once (Service.ended). A token of another size is
		// refused (expectToken), and not kept.
		defer s.endToken(string(req.Token))
	}
	if err := checkMetas(req.Tensors, req.Dir); err != nil {
		c.sendError(err)
		return err
	}
	total := metaBytes(req.Tensors)
	if len(req.IPC) > 0 {
		return s.servePutIPC(c, req)
	}
	if req.RMA {
		if p := s.carrier(c.peer, c.instance); p != nil && len(req.RMASrcAt) == len(req.Tensors) {
			return s.servePutRMA(c, req, p)
		}
		// No endpoint to the sender that carries copies: a TCP put, whose data
		// waits for our go-ahead however small.
	}
	eager := !req.RMA && eagerPut(total, req.Streams, req.Chunk)
	var early *pending
	if req.Early {
		k := streamsFor(total, req.Streams, req.Chunk)
		var err error
		if req.RMA || k < 2 {
			err = &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: an early put of %d streams", c.peer, k)}
		} else {
			early, err = s.expectToken(c.peer, req.Token, k-1)
		}
		if err != nil {
			// Its data is coming on streams this node cannot take.
			c.sendError(err)
			return &Error{Errno: syscall.EPROTO, Msg: err.Error(), broken: true}
		}
		eager = true
		// A put refused or failed before recvPut takes the streams: the
		// joins that came are let go (recvPut's close is the same call).
		defer early.close(nil)
	}
	if err := s.refuseTCP(c); err != nil && total > 0 {
		if early != nil {
			// Its data is coming on several streams: refused, and c
			// dropped (the joins with it, by the deferred close).
			c.sendError(err)
			return &Error{Errno: Errno(err), Msg: err.Error(), broken: true}
		}
		if eager {
			// Its data is coming behind the request: read to its
			// done frame first, so that the refusal reaches the
			// sender (a close with unread bytes resets the
			// connection, and the sender saw EIO) and c stays in step.
			if derr := c.drainEager(); derr != nil {
				return &Error{Errno: syscall.EPROTO, Msg: derr.Error(), broken: true}
			}
		}
		c.sendError(err)
		return err
	}
	rec, end := s.Track(c.peer, req.Path, "tcp", req.Tensors)
	n, err := Deliver(rec, req.Tensors, s.putPrepare(c, req, eager), func(dest Dest, abort func()) error {
		return s.recvPut(c, req, total, eager, early, dest, abort, rec)
	}, s.putCommit(c))
	end(err)
	if err != nil {
		return err
	}
	return c.sendJSON(frameOK, reply{Copied: n})
}

// putPrepare is a served put's prepare step (Deliver): the destination's
// temporaries and pins, with keepalives to the sender meanwhile, and the
// sender told of a failure. eager: its data is already coming, so a
// failure leaves the connection out of step.
func (s *Service) putPrepare(c *conn, req request, eager bool) func(descs []Meta) (Dest, error) {
	return func(descs []Meta) (dest Dest, err error) {
		err = c.whileSilent(func() (err error) {
			dest, err = s.local.Put(req.Path, req.Dir, descs)
			return err
		})
		if err != nil {
			c.sendError(err)
			if eager {
				// Its data is coming: the connection is out of step,
				// and the sender, told why, drops it.
				err = &Error{Errno: Errno(err), Msg: err.Error(), broken: true}
			}
		}
		return dest, err
	}
}

// putCommit is a served put's commit step (Deliver), the sender told of a
// failure.
func (s *Service) putCommit(c *conn) func(dest Dest) (int, error) {
	return func(dest Dest) (n int, err error) {
		err = c.whileSilent(func() (err error) {
			n, err = dest.Commit()
			return err
		})
		if err != nil {
			c.sendError(&Error{Errno: Errno(err), Msg: err.Error(), Copied: n})
		}
		return n, err
	}
}

// recvPut takes a TCP put's bytes into dest: it tells the sender how many
// streams to open (several when it asks and the copy is large; with one,
// chunks come in order whatever the sender's chunk size), then receives
// them. At a failure recvChunks aborts dest, then the sender hears why on
// c; recvChunks then reads on until the sender stops, so c stays in step
// for the next request.
func (s *Service) recvPut(c *conn, req request, total int64, eager bool, early *pending, dest Dest, abort func(), rec *Record) error {
	k := streamsFor(total, req.Streams, req.Chunk)
	pend := early
	ok := reply{}
	var joins <-chan joined
	var chunk int64
	if k > 1 {
		if pend == nil {
			pend = s.expect(c.peer, k-1)
		}
		ok.Streams, ok.Token = k, []byte(pend.token)
		joins, chunk = pend.joins, int64(req.Chunk)
	}
	if !eager { // else the data is on its way
		if err := c.sendJSON(frameOK, ok); err != nil {
			pend.close(nil)
			return netErr(err)
		}
	}
	extras, _, err := s.recvChunks(c, joins, k-1, false, dest, req.Tensors, chunk, req.Recheck, rec, abort, func(err error) { c.sendError(err) })
	pend.close(extras)
	return err
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
	entries, held, err := s.importAll(c, req.IPC)
	if err != nil {
		err := &Error{Errno: syscall.EXDEV, Msg: err.Error()}
		c.sendError(err)
		return err
	}
	defer s.releaseAll(held)
	rec, end := s.Track(c.peer, req.Path, "ipc", req.Tensors)
	var n int
	// The sender hears how far the copy is (and that it is alive) every
	// progressEvery.
	err = c.whileCopying(rec, func() (err error) {
		n, err = Deliver(rec, req.Tensors, func(descs []Meta) (Dest, error) {
			return s.local.Put(req.Path, req.Dir, descs)
		}, func(dest Dest, _ func()) error {
			return copyExports(entries, req.IPC, req.Tensors, dest, s.cfg.ChunkSize, rec, c.gone)
		}, nil)
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
	srcs, isDir, label, err := s.getSources(req)
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
	// The records' mode: the puller writes them in place (it said so).
	recMetas := metas
	if req.InPlace {
		recMetas = make([]Meta, len(metas))
		for i, m := range metas {
			m.InPlace = true
			recMetas[i] = m
		}
	}
	if req.IPCOK && s.sameHost(c) {
		if descs, release, ok := s.exports(srcs, c, s.chanTo(c.instance)); ok {
			// The client reads our memory while we hold the pins and
			// leases, until it says done (or fails).
			defer release()
			rec, end := s.Track(label, c.peer, "ipc", recMetas)
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
	if req.RMA && total > 0 {
		// No bytes (an empty tensor or tree): nothing to reach, the
		// TCP answer says it all. Served on RMA only when this node's
		// own endpoint to the puller carries copies: its worker is the
		// one that serves emulated gets, and would abort if the puller
		// died mid-copy (a puller with --ucx-any-endpoint asked anyway;
		// it takes the TCP answer).
		if p := s.carrier(c.peer, c.instance); p != nil {
			return s.serveGetRMA(c, p, srcs, metas, recMetas, isDir, label)
		}
	}
	if err := s.refuseTCP(c); err != nil && total > 0 {
		c.sendError(err)
		return err
	}
	rec, end := s.Track(label, c.peer, "tcp", recMetas)
	chunk := s.chunkFor(total)
	k := streamsFor(total, req.Streams, chunk)
	var pend *pending
	// In place, the client's prepare only checks and pins, and a small
	// copy's allocation is quick and its data fits the sockets: the data
	// goes at once (a go-ahead cost a 4 KiB pull 50-140 µs on the 2-vCPU VM).
	ok := reply{Dir: isDir, Tensors: metas, WaitGo: !req.InPlace && (k > 1 || total > goAheadMin)}
	var joins <-chan joined
	if k > 1 {
		pend = s.expect(c.peer, k-1)
		ok.Streams, ok.Token, ok.Chunk = k, []byte(pend.token), chunk
		joins = pend.joins
	}
	if err := c.sendJSON(frameOK, ok); err != nil {
		pend.close(nil)
		end(err)
		return netErr(err)
	}
	if ok.WaitGo {
		// recv waits a timeout from each keepalive of the client's.
		if err := c.recvJSON(frameOK, nil); err != nil {
			pend.close(nil)
			end(err)
			var te *Error
			if errors.As(err, &te) && !te.broken {
				return nil // the client's own failure; the connection is fine
			}
			return err
		}
	}
	extras, err := s.sendChunks(c, joins, k-1, false, srcs, chunk, req.Recheck, rec, func(error) { c.c.Close() })
	pend.close(extras)
	end(err)
	return err
}

// getSources opens the sources a get (or its check) asks for: a range
// list's (listSources), or the tensors at req.Path (with its range);
// label names them for records and logs. Errors: listSources' and
// Local.Get's.
func (s *Service) getSources(req request) (srcs []Source, isDir bool, label string, err error) {
	var r Range
	if req.Range != nil {
		r = *req.Range
		r.Set = true
	}
	if req.Tensors != nil {
		srcs, label, err = s.listSources(req)
		return srcs, false, label, err
	}
	srcs, isDir, err = s.local.Get(req.Path, r)
	return srcs, isDir, req.Path + r.String(), err
}

// listSources opens the sources of a range-list get (Pull.Lists), one per
// descriptor: the spans of the tensor at its Rel below req.Path; label
// names them for the transfer's record. Every list is checked and opened
// before the reply, so a bad one moves nothing; on an error none is left
// open. Errors: EPROTO for a request that is not a range list (a range, a
// directory, a descriptor without spans, IPC descriptors); EINVAL for a
// path that leaves the mount, a directory, or a span outside its tensor;
// the lookup's (ENOENT).
func (s *Service) listSources(req request) (srcs []Source, label string, err error) {
	if req.Range != nil || req.Dir || len(req.IPC) > 0 {
		return nil, "", &Error{Errno: syscall.EPROTO, Msg: "a range-list get carries descriptors of spans and no range"}
	}
	defer func() {
		if err != nil {
			for _, sc := range srcs {
				sc.Close()
			}
			srcs = nil
		}
	}()
	for i, m := range req.Tensors {
		if m.Spans == nil {
			return srcs, "", &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("descriptor %d of a range-list get has no spans", i)}
		}
		if err := checkSpans(m.Spans, m.NBytes); err != nil {
			return srcs, "", err
		}
		// Rel "" names req.Path itself (how a get of one list was asked
		// before lists named their tensors).
		p := req.Path
		if m.Rel != "" {
			rel, err := CleanRel(m.Rel)
			if err != nil {
				return srcs, "", &Error{Errno: syscall.EINVAL, Msg: fmt.Sprintf("tensor path %q of a range-list get", m.Rel)}
			}
			p = path.Join(req.Path, rel)
		}
		got, isDir, err := s.local.Get(p, Range{Spans: m.Spans})
		if err == nil && (isDir || len(got) != 1) {
			for _, sc := range got {
				sc.Close()
			}
			err = &Error{Errno: syscall.EINVAL, Msg: fmt.Sprintf("%s: a range list of a directory", p)}
		}
		if err != nil {
			return srcs, "", err
		}
		srcs = append(srcs, got[0])
		if i == 0 {
			label = p + Range{Spans: m.Spans}.String()
		}
	}
	if len(req.Tensors) > 1 {
		label += fmt.Sprintf(" and %d more lists", len(req.Tensors)-1)
	}
	return srcs, label, nil
}

// receiveTCP receives the data of a get that the peer answered with r into
// dest, over c and the extra streams r asks for (back to the idle pool
// after a success).
func (s *Service) receiveTCP(c *conn, peer string, r reply, dest Dest, recheck bool, rec *Record) error {
	want := 0
	var chunk int64
	var joins <-chan joined
	if r.Streams > 1 {
		if r.Streams > MaxStreams || r.Chunk < minGridChunk || r.Chunk > MaxFrame-dataHeaderLen-1 {
			return &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: %d streams of %d-byte chunks", c.peer, r.Streams, r.Chunk)}
		}
		want, chunk = r.Streams-1, int64(r.Chunk)
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
		defer cancel()
		joins = s.joinStreams(ctx, peer, r.Token, want, false)
	}
	extras, _, err := s.recvChunks(c, joins, want, true, dest, r.Tensors, chunk, recheck, rec, nil, func(error) { c.c.Close() })
	s.releaseStreams(peer, extras, err)
	return err
}

// checkMetas validates a peer's descriptor list: relative paths without
// "..", non-negative sizes and offsets, one descriptor with Rel "" for a
// file copy; a path named twice only by in-place descriptors (many ranges
// of one tensor), never by a whole-tensor one.
func checkMetas(metas []Meta, isDir bool) error {
	if !isDir && (len(metas) != 1 || metas[0].Rel != "") {
		return &Error{Errno: syscall.EPROTO, Msg: "a file copy carries exactly one tensor"}
	}
	whole := map[string]bool{}
	for _, m := range metas {
		if m.NBytes < 0 || m.Off < 0 || m.Off > math.MaxInt64-m.NBytes || !m.InPlace && (m.Off != 0 || m.Exact) ||
			m.Spans != nil && (!m.InPlace || m.Exact || m.Off != 0) {
			return &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("descriptor %q of %d bytes at %d", m.Rel, m.NBytes, m.Off)}
		}
		if m.Spans != nil {
			if err := checkSpans(m.Spans, m.NBytes); err != nil {
				return err
			}
		}
		if isDir {
			if _, err := CleanRel(m.Rel); err != nil {
				return &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("tensor path %q", m.Rel)}
			}
			if !m.InPlace {
				if whole[m.Rel] {
					return &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("tensor path %q named twice", m.Rel)}
				}
				whole[m.Rel] = true
			}
		}
	}
	return nil
}
