package transfer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"syscall"
	"time"
)

type idleConn struct {
	c     *conn
	since time.Time // idle since
	beat  time.Time // the last keepalive sent on it (or since)
}

// maxIdle is how many idle connections are kept per peer (enough for the
// streams of two transfers); more are closed. leaseIdleFor is how long an
// unused lease channel stays open (bounded by half the timeout, after which
// its peer would drop it).
const (
	maxIdle      = 2 * MaxStreams
	leaseIdleFor = 2 * time.Second
	// DefaultIdleTimeout is Config.IdleTimeout's default.
	DefaultIdleTimeout = 30 * time.Second
	// DefaultSpin is the daemon's --spin on hosts of at least 4 CPUs
	// (Config.Spin): long enough to cover a 1 GiB copy on one GPU (about
	// 0.55 ms on an H200) and the gap between the copies of a burst.
	DefaultSpin = time.Millisecond
)

// idleLimit is how long an idle copy connection is kept: Config.IdleTimeout.
func (s *Service) idleLimit() time.Duration { return s.cfg.IdleTimeout }

// leaseIdle is how long an unused lease channel stays open.
func (s *Service) leaseIdle() time.Duration { return min(leaseIdleFor, s.cfg.Timeout/2) }

// idleBeat is how often an idle connection says it is alive: the peer
// drops a connection silent for its timeout (a peer's may be shorter than
// ours: at most a second apart).
func (s *Service) idleBeat() time.Duration { return min(s.cfg.Timeout/3, time.Second) }

// reapIdle closes idle connections past idleLimit, sends keepalives on the
// others that are due one, and runs again while any remain.
func (s *Service) reapIdle() {
	s.mu.Lock()
	left := 0
	var due []idleConn
	for peer, l := range s.idle {
		kept := l[:0]
		for _, ic := range l {
			switch {
			case time.Since(ic.since) >= s.idleLimit():
				ic.c.c.Close()
			case time.Since(ic.beat) >= s.idleBeat():
				due = append(due, ic) // out of the pool while it beats
			default:
				kept = append(kept, ic)
			}
		}
		s.idle[peer] = kept
		left += len(kept)
	}
	s.mu.Unlock()
	for _, ic := range due {
		err := ic.c.send(frameKeepalive, nil)
		if err == nil {
			err = ic.c.flush()
		}
		if err != nil || !alive(ic.c) {
			ic.c.c.Close()
			continue
		}
		ic.beat = time.Now()
		s.mu.Lock()
		if s.closed || len(s.idle[ic.c.peer]) >= maxIdle {
			ic.c.c.Close()
		} else {
			s.idle[ic.c.peer] = append(s.idle[ic.c.peer], ic)
			left++
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	s.reaping = left > 0
	if s.reaping {
		time.AfterFunc(s.reapEvery(), s.reapIdle)
	}
	s.mu.Unlock()
}

// reapEvery is the reaper's period.
func (s *Service) reapEvery() time.Duration { return min(s.idleLimit(), s.idleBeat()) / 2 }

// IdleConns is the number of idle authenticated connections this node
// keeps to its peers now (stats' connections.idle).
func (s *Service) IdleConns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, l := range s.idle {
		n += len(l)
	}
	return n
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
		// Kept alive by keepalives (reapIdle); give up on one past the idle
		// limit, and on one that the peer has closed (a read that does not
		// wait finds EOF rather than a timeout): a broken connection is
		// replaced by a new one.
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
	if c.r.Buffered() > 0 || len(c.c.pre) > 0 {
		return false
	}
	raw, err := c.c.SyscallConn()
	if err != nil {
		return false
	}
	// A read deadline left by the last exchange would make raw.Read fail
	// without looking (a connection idle past its timeout, kept by
	// keepalives, then seemed dead); the next exchange arms its own.
	c.c.SetReadDeadline(time.Time{})
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
	now := time.Now()
	s.idle[peer] = append(s.idle[peer], idleConn{c: c, since: now, beat: now})
	if !s.reaping {
		s.reaping = true
		time.AfterFunc(s.reapEvery(), s.reapIdle)
	}
}

// dial connects and authenticates to a named peer, found by resolve (no
// network round trip). A peer of this host whose unix socket a TCP
// handshake of ours learned (learnLocal) is dialled there; when that fails
// the socket is forgotten and TCP used. A TCP handshake that reveals such a
// socket is followed by a dial there, which the copy takes (and the pool
// after it) when it succeeds: one more handshake at a peer's first
// contact, instead of loopback TCP for every copy after. Errors: ENOENT for
// an unknown peer, EHOSTUNREACH for one the Resolver saw leave, the dial's
// errno (ECONNREFUSED, EHOSTUNREACH, ETIMEDOUT), EACCES for a refused
// authentication, EPROTO for a version mismatch: TCP's.
func (s *Service) dial(ctx context.Context, peer string) (*conn, error) {
	if c, err := s.dialLocal(ctx, peer); c != nil || err != nil {
		return c, err
	}
	addr, err := s.resolve(peer)
	if err != nil {
		return nil, err
	}
	c, err := s.dialTCP(ctx, peer, addr)
	if err != nil {
		return nil, err
	}
	s.learnLocal(peer, c)
	if uc, _ := s.dialLocal(ctx, peer); uc != nil {
		c.c.Close()
		return uc, nil
	}
	return c, nil
}

// dialLocal is dial on peer's unix socket (localFor): nil when it has
// none or the dial there failed (then forgotten, and logged), with an
// error only when the peer's own process (its pid checked) let the
// handshake time out: TCP to a silent peer would wait as long again. The process
// listening there must be the one the TCP handshake named
// (SO_PEERCRED), checked before a byte is sent: any local user can bind
// an abstract name that is free (a restarted peer's old one, or every
// name of a peer in another network namespace), and one that accepts
// and stays silent would hold the dial to the timeout. The handshake must
// then come from the instance that offered the socket, under peer's name.
func (s *Service) dialLocal(ctx context.Context, peer string) (*conn, error) {
	lp, ok := s.localFor(peer)
	if !ok {
		return nil, nil
	}
	c, err := s.dialUnix(ctx, peer, lp)
	if err != nil && Errno(err) == syscall.ETIMEDOUT {
		slog.Info("the peer's unix socket answered nothing within the timeout", "peer", peer, "socket", lp.sock, "err", err)
		s.forgetLocal(peer, lp, false)
		return nil, err
	}
	if err != nil {
		// A socket that is not there, or not the peer's, is never tried
		// again; a timeout or a cancelled copy says nothing of the socket,
		// so the next TCP handshake may offer it again.
		var wrong *wrongListener
		lasting := errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) || errors.As(err, &wrong) || Errno(err) == syscall.EACCES
		slog.Info("not using the peer's unix socket; connecting over TCP", "peer", peer, "socket", lp.sock, "err", err, "again", !lasting)
		s.forgetLocal(peer, lp, lasting)
		return nil, nil
	}
	return c, nil
}

// wrongListener: the process or node at a unix socket is not the peer
// that offered it.
type wrongListener struct{ msg string }

func (e *wrongListener) Error() string { return e.msg }

// dialUnix connects to lp and authenticates, checking who listens there
// (dialLocal).
func (s *Service) dialUnix(ctx context.Context, peer string, lp localPeer) (*conn, error) {
	d := net.Dialer{Timeout: s.cfg.Timeout}
	nc, err := d.DialContext(ctx, "unix", lp.sock)
	if err != nil {
		return nil, err
	}
	if cred, err := peerCred(nc); err != nil || int(cred.Pid) != lp.pid {
		nc.Close()
		if err != nil {
			return nil, err
		}
		return nil, &wrongListener{fmt.Sprintf("process %d listens there, not the peer's %d", cred.Pid, lp.pid)}
	}
	c, err := s.authConn(nc, peer, lp.sock)
	if err != nil {
		return nil, err
	}
	if c.instance != lp.instance || c.name != peer {
		nc.Close()
		return nil, &wrongListener{fmt.Sprintf("the node there is %s (instance %s), not %s (instance %s)", c.name, c.instance, peer, lp.instance)}
	}
	return c, nil
}

// dialTCP connects to peer at addr and authenticates. Errors as dial's.
func (s *Service) dialTCP(ctx context.Context, peer, addr string) (*conn, error) {
	d := net.Dialer{Timeout: s.cfg.Timeout}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return nil, &Error{Errno: errno, Msg: fmt.Sprintf("peer %s at %s: %v", peer, addr, err)}
		}
		return nil, netErr(err)
	}
	return s.authConn(nc, peer, addr)
}

// authConn authenticates the connection nc dialled to peer at addr,
// closing it on an error (authenticate's).
func (s *Service) authConn(nc net.Conn, peer, addr string) (*conn, error) {
	c := newConn(nc, s.cfg.Timeout, peer)
	c.c.spin = s.cfg.Spin
	if err := s.authenticate(c, addr); err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}
