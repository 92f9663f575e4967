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
// point where bytes would move, then let go. One more round trip per
// transfer, for those calls only. A destination that another process
// changes between the check and the copy (a truncate) can still fail the
// copy later; the checks are for the call's own lines.

// Check asks peer whether a put of srcs to remotePath (isDir: a tree)
// would be accepted, moving nothing: the peer prepares the destinations
// (checks every in-place range, and allocates the temporaries of whole
// tensors: send only the in-place descriptors when those are what is to
// be checked) and lets them go. Errors: as Send's refusals (ENOENT,
// EINVAL, EISDIR, ...), and the connection's.
func (s *Service) Check(ctx context.Context, peer, remotePath string, srcs []Source, isDir bool) (err error) {
	remotePath, err = CleanPath(remotePath)
	if err != nil {
		return err
	}
	metas := make([]Meta, len(srcs))
	for i, sc := range srcs {
		metas[i] = sc.Meta()
	}
	return s.ask(ctx, peer, request{Op: "check-put", Path: remotePath, Dir: isDir, Tensors: metas}, nil)
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
	if err := s.ask(ctx, p.Peer, p.request("check-get"), &r); err != nil {
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

// ask sends req to peer on a kept-open connection and reads its reply
// into r (nil: none wanted).
func (s *Service) ask(ctx context.Context, peer string, req request, r *reply) (err error) {
	c, err := s.conn(ctx, peer)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { c.c.Close() })
	defer func() { s.done(peer, c, stop(), err) }()
	if err := c.sendJSON(frameRequest, req); err != nil {
		return netErr(err)
	}
	if r == nil {
		r = &reply{}
	}
	return c.recvJSON(frameOK, r)
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
// and let go, nothing moved.
func (s *Service) serveCheckPut(c *conn, req request) error {
	if len(req.IPC) > 0 || req.Early || req.RMA {
		// Nothing may follow a check: a request that says otherwise
		// leaves the connection out of step.
		err := &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: a check with data or memory of its own", c.peer)}
		c.sendError(err)
		return err
	}
	err := checkMetas(req.Tensors, req.Dir)
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
	return c.sendJSON(frameOK, reply{Dir: isDir, Tensors: metas})
}
