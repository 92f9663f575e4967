package transfer

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"syscall"
)

// maxKeptSpans bounds the span array a connection keeps between requests
// (serve): 512 KiB, a 64 KiB value's descriptors several times over.
const maxKeptSpans = 1 << 14

// serve runs one accepted connection: the handshake, then requests.
func (s *Service) serve(nc net.Conn) {
	c, err := s.handshake(nc)
	if err != nil {
		slog.Warn("peer refused", "peer", remoteLabel(nc), "err", err)
		return
	}
	// The span lists of this connection's requests, one array reused
	// (decodeMsgIn) while each is done with when the next comes.
	var spans []Span
	for {
		var req request
		s.waiting.Add(1)
		typ, p, err := c.recv()
		s.waiting.Add(-1)
		if err != nil {
			return // the peer hung up, or went silent past the timeout
		}
		if typ != frameRequest {
			c.sendError(&Error{Errno: syscall.EPROTO, Msg: "expected a request"})
			return
		}
		if err := decodeMsgIn(p, &req, &spans); err != nil {
			var te *Error
			if !errors.As(err, &te) {
				te = &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("malformed request: %v", err)}
			}
			c.sendError(te)
			return
		}
		var rerr error
		if p, err := CleanPath(req.Path); err != nil {
			c.sendError(err)
			continue
		} else {
			req.Path = p
		}
		switch req.Op {
		case "put":
			rerr = s.servePut(c, req)
		case "get":
			rerr = s.serveGet(c, req)
		case "check-put":
			rerr = s.serveCheckPut(c, req)
		case "check-get":
			rerr = s.serveCheckGet(c, req)
		case "lease":
			s.serveLease(c)
			return
		case "join":
			if !s.serveJoin(c, req) {
				return
			}
		default:
			rerr = &Error{Errno: syscall.EINVAL, Msg: fmt.Sprintf("unknown op %q", req.Op)}
			c.sendError(rerr)
		}
		if req.Op != "put" || rerr != nil || cap(spans) > maxKeptSpans {
			// A put that succeeded read its spans for the last time
			// before its reply. Another request's may still be read
			// (a get's sources hold them; so might a failed put's
			// streams, on their way out): the next request gets its
			// own array.
			spans = nil
		}
		if rerr != nil {
			slog.Warn("peer request failed", "peer", c.peer, "op", req.Op, "path", req.Path, "errno", errnoName(Errno(rerr)), "err", rerr)
			var te *Error
			if !errors.As(rerr, &te) || te.broken || te.Errno == syscall.EPROTO || te.Errno == syscall.ETIMEDOUT || te.Errno == syscall.EIO {
				return // the stream is in an unknown state: drop the connection
			}
		}
	}
}
