package transfer

import (
	"context"
	"fmt"
	"syscall"
)

// The checks of a call whose lines write on several peers. A peer checks a
// transfer's every descriptor before it writes one, so a call of one
// transfer that is refused writes nothing; a call of several (two peers,
// or a pull and a push) would leave the bytes of the transfers that ran
// before the refused one. Such a call first asks each peer whether its
// transfer would be accepted: the same request, answered as far as the
// point where bytes would move, then let go. The caller runs them at once:
// one more round trip, for those calls only. A destination that another process
// changes between the check and the copy (a truncate) can still fail the
// copy later; the checks are for the call's own lines.

// Check asks peer whether a put of srcs to remotePath (isDir: a tree)
// would be accepted, moving nothing: the peer prepares the destinations
// (checks every in-place range, and allocates the temporaries of whole
// tensors: send only the in-place descriptors when those are what is to
// be checked) and lets them go; the transport is checked as Send's would
// be (a node or peer that runs with --transport ucx and has no endpoint
// that carries copies refuses TCP). Errors: as Send's refusals (ENOENT,
// EINVAL, EISDIR, EPROTONOSUPPORT, ...), and the connection's.
func (s *Service) Check(ctx context.Context, peer, remotePath string, srcs []Source, isDir bool) (err error) {
	remotePath, err = CleanPath(remotePath)
	if err != nil {
		return err
	}
	metas, err := sendMetas(srcs)
	if err != nil {
		return err
	}
	return s.ask(ctx, peer, func(c *conn) (request, error) {
		req := request{Op: "check-put", Path: remotePath, Dir: isDir, Tensors: metas}
		if !s.sameHost(c) { // same host: IPC, as Send takes it
			p, err := s.rmaFor(peer, c)
			req.RMA = p != nil
			return req, err
		}
		return req, nil
	}, nil)
}

// CheckPull asks p.Peer for the descriptors Receive of p would get,
// moving nothing, and checks them here: prepare gets them as Receive's
// would, and the Dest it returns is aborted at once. Errors: as
// Receive's refusals, prepare's, and the connection's.
func (s *Service) CheckPull(ctx context.Context, p Pull, prepare func(isDir bool, descs []Meta) (Dest, error)) (err error) {
	if p, err = cleanPull(p); err != nil {
		return err
	}
	var r reply
	err = s.ask(ctx, p.Peer, func(c *conn) (request, error) {
		req := p.request("check-get")
		req.IPCOK = s.sameHost(c)
		rp, err := s.rmaFor(p.Peer, c)
		if err != nil && !req.IPCOK { // as receive refuses
			return req, err
		}
		req.RMA = rp != nil
		return req, nil
	}, &r)
	if err != nil {
		return err
	}
	descs, err := pullDescs(r, p)
	if err != nil {
		return err
	}
	dest, err := prepare(r.Dir, descs)
	if err != nil {
		return err
	}
	dest.Abort()
	return nil
}

// ask sends the request that build makes for a kept-open connection to
// peer and reads its reply into r (nil: none wanted). build's error is
// returned, nothing sent.
func (s *Service) ask(ctx context.Context, peer string, build func(c *conn) (request, error), r *reply) error {
	c, err := s.conn(ctx, peer)
	if err != nil {
		return err
	}
	stop := closeOnDone(ctx, c)
	req, err := build(c)
	if err != nil {
		s.done(peer, c, stop(), nil) // nothing sent: the connection is fine
		return err
	}
	if err = c.sendJSON(frameRequest, req); err != nil {
		err = netErr(err)
	} else {
		if r == nil {
			r = &reply{}
		}
		err = c.recvJSON(frameOK, r)
	}
	s.done(peer, c, stop(), err)
	return err
}

// pullDescs is the destination descriptors of a pull of p answered with
// r: a range-list pull's (spanDescs), or the peer's tensors with p's
// destination range applied. Errors: EPROTO for an answer that is not
// what was asked, EINVAL for a range that does not fit.
func pullDescs(r reply, p Pull) ([]Meta, error) {
	if p.Lists != nil {
		return spanDescs(r, p.Lists)
	}
	if err := checkMetas(r.Tensors, r.Dir); err != nil {
		return nil, err
	}
	return p.DstRange.Apply(r.Tensors, r.Dir)
}

// serveCheckPut answers a "check-put": the put's destinations prepared
// and let go, nothing moved; a put this node would refuse for its
// transport (refuseTCP) is refused.
func (s *Service) serveCheckPut(c *conn, req request) error {
	if len(req.IPC) > 0 || req.Early || len(req.RMASrc) > 0 || len(req.RMASrcAt) > 0 {
		// Nothing may follow a check: a request that says otherwise
		// leaves the connection out of step.
		err := &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: a check with data or memory of its own", c.peer)}
		c.sendError(err)
		return err
	}
	err := checkMetas(req.Tensors, req.Dir)
	if err == nil && !(req.RMA && s.carrier(c.peer, c.instance) != nil) && metaBytes(req.Tensors) > 0 {
		err = s.refuseTCP(c)
	}
	if err == nil {
		err = c.whileSilent(func() error {
			dest, err := s.local.Put(req.Path, req.Dir, req.Tensors)
			if err == nil {
				dest.Abort()
			}
			return err
		})
	}
	if err != nil {
		c.sendError(err)
		return err
	}
	return c.sendJSON(frameOK, reply{})
}

// serveCheckGet answers a "check-get": the get's sources opened and
// closed, the reply their descriptors (a get's first reply, without
// exports or streams), nothing sent.
func (s *Service) serveCheckGet(c *conn, req request) error {
	srcs, isDir, _, err := s.getSources(req)
	if err != nil {
		c.sendError(err)
		return err
	}
	metas := make([]Meta, len(srcs))
	for i, sc := range srcs {
		metas[i] = sc.Meta()
		sc.Close()
	}
	n := metaBytes(metas)
	ipc := req.IPCOK && s.sameHost(c)
	rma := req.RMA && n > 0 && s.carrier(c.peer, c.instance) != nil
	if !ipc && !rma && n > 0 {
		if err := s.refuseTCP(c); err != nil {
			c.sendError(err)
			return err
		}
	}
	return c.sendJSON(frameOK, reply{Dir: isDir, Tensors: metas})
}

// metaBytes is the bytes of metas' descriptors.
func metaBytes(metas []Meta) int64 {
	var n int64
	for _, m := range metas {
		n += m.NBytes
	}
	return n
}
