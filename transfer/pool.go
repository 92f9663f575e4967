package transfer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

type idleConn struct {
	c     *conn
	since time.Time
}

// maxIdle is how many idle connections are kept per peer (enough for the
// streams of two transfers), and idleFor how long at most (also bounded by half the timeout, after which the peer drops
// a silent connection); idle ones are closed then, so an idle node holds no
// sockets.
const (
	maxIdle = 2 * MaxStreams
	idleFor = 2 * time.Second
)

func (s *Service) idleLimit() time.Duration { return min(idleFor, s.cfg.Timeout/2) }

// reapIdle closes idle connections past idleLimit, and runs again while
// any remain.
func (s *Service) reapIdle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	left := 0
	for peer, l := range s.idle {
		kept := l[:0]
		for _, ic := range l {
			if time.Since(ic.since) >= s.idleLimit() {
				ic.c.c.Close()
			} else {
				kept = append(kept, ic)
			}
		}
		s.idle[peer] = kept
		left += len(kept)
	}
	s.reaping = left > 0
	if s.reaping {
		time.AfterFunc(s.idleLimit()/2, s.reapIdle)
	}
}

// conn returns an authenticated connection to peer: an idle one that is
// still open, or a new one (see dial for the errors).
func (s *Service) conn(ctx context.Context, peer string) (*conn, error) {
	for {
		s.mu.Lock()
		l := s.idle[peer]
		if len(l) == 0 {
			s.mu.Unlock()
			return s.dial(ctx, peer)
		}
		ic := l[len(l)-1]
		s.idle[peer] = l[:len(l)-1]
		s.mu.Unlock()
		// The peer drops a connection silent for its timeout; give up on one
		// idle for half of ours, and on one that the peer has closed (a read
		// that does not wait finds EOF rather than a timeout).
		if time.Since(ic.since) < s.idleLimit() && alive(ic.c) {
			return ic.c, nil
		}
		ic.c.c.Close()
	}
}

// alive reports whether c has neither data nor an end waiting, with a
// non-blocking peek at the socket (a Go read with a past deadline would not
// look at all).
func alive(c *conn) bool {
	if c.r.Buffered() > 0 {
		return false
	}
	raw, err := c.c.SyscallConn()
	if err != nil {
		return false
	}
	idle := false
	var b [1]byte
	raw.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		idle = err == syscall.EAGAIN && n <= 0
		return true // never wait for readiness
	})
	return idle
}

// done ends a copy's use of c: kept for the next copy to the same peer when
// the copy succeeded and its context did not close c (open), else closed.
func (s *Service) done(peer string, c *conn, open bool, err error) {
	if err != nil || !open || c.c.closed.Load() {
		c.c.Close()
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.idle[peer]) >= maxIdle {
		c.c.Close()
		return
	}
	if s.idle == nil {
		s.idle = map[string][]idleConn{}
	}
	s.idle[peer] = append(s.idle[peer], idleConn{c: c, since: time.Now()})
	if !s.reaping {
		s.reaping = true
		time.AfterFunc(s.idleLimit()/2, s.reapIdle)
	}
}

// dial connects and authenticates to a named peer, found by resolve (no
// network round trip). Errors: ENOENT for an unknown peer, EHOSTUNREACH for
// one the Resolver saw leave, the dial's errno (ECONNREFUSED, EHOSTUNREACH, ETIMEDOUT),
// EACCES for a refused authentication, EPROTO for a version mismatch.
func (s *Service) dial(ctx context.Context, peer string) (*conn, error) {
	addr, err := s.resolve(peer)
	if err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: s.cfg.Timeout}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return nil, &Error{Errno: errno, Msg: fmt.Sprintf("peer %s at %s: %v", peer, addr, err)}
		}
		return nil, netErr(err)
	}
	c := newConn(nc, s.cfg.Timeout, peer)
	if err := s.authenticate(c, addr); err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}
