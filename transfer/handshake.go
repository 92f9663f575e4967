package transfer

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
)

// authenticate runs the client half of the handshake on a dialed connection
// to the peer at addr: hello, the server's challenge and proof, then ours.
// Errors as for dial (EACCES, EPROTO, the connection's); the caller closes
// the connection on one.
func (s *Service) authenticate(c *conn, addr string) error {
	arm := c.armBy(time.Now().Add(s.cfg.Timeout))
	cn := nonce()
	if err := c.sendJSON(frameHello, hello{Version: ProtocolVersion, Name: s.cfg.Name, HostID: s.cfg.HostID, Nonce: cn, Instance: s.instance, Imports: s.importKinds(), NoSecret: len(s.cfg.Secret) == 0, UCX: s.rmaAddress(), NoChecksum: s.cfg.Checksum == ChecksumNone, XXH3: s.cfg.Checksum.takesXXH3(), Recheck: true, Bind: true, Local: s.localName, PID: s.localPID(), NS: s.localNS()}); err != nil {
		return netErr(err)
	}
	var ch challenge
	if err := c.recvJSONArmed(frameChallenge, &ch, arm); err != nil {
		return err
	}
	if ch.Version != ProtocolVersion {
		return &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("protocol version mismatch: peer %s speaks %d, node %s speaks %d", c.peer, ch.Version, s.cfg.Name, ProtocolVersion)}
	}
	if !hmac.Equal(ch.Proof, proof(s.cfg.Secret, "server", cn, ch.Nonce, s.cfg.Name, ch.Name)) {
		// Either side may hold the wrong secret (or none): say so, and tell
		// the server too, whose log would otherwise show only an EOF.
		none := len(s.cfg.Secret) == 0
		err := &Error{Errno: syscall.EACCES, Msg: secretMismatch(s.cfg.Name, none, ch.NoSecret, ch.Name, addr)}
		c.sendError(&Error{Errno: syscall.EACCES, Msg: secretMismatch(ch.Name, ch.NoSecret, none, s.cfg.Name, c.c.LocalAddr().String()) + " (refused by " + s.cfg.Name + ")"})
		return err
	}
	if err := c.sendJSON(frameAuth, authMsg{Proof: proof(s.cfg.Secret, "client", cn, ch.Nonce, s.cfg.Name, ch.Name)}); err != nil {
		return netErr(err)
	}
	if err := c.recvJSONArmed(frameOK, nil, arm); err != nil {
		return err
	}
	c.hostID = ch.HostID
	c.instance, c.imports, c.noChecksum, c.xxh3, c.recheck, c.binds = ch.Instance, ch.Imports, ch.NoChecksum, ch.XXH3, ch.Recheck, ch.Bind
	c.max = MaxFrame
	s.notePeer(ch.Name, ch.HostID, ch.Instance, s.checksumFor(c))
	c.name, c.local, c.pid, c.ns = ch.Name, ch.Local, ch.PID, ch.NS
	s.noteRMA(ch.Name, ch.Instance, ch.UCX)
	return nil
}

// armBy returns the arm of every read of a handshake: one deadline for the
// whole exchange. Per frame, a peer that sends keepalives (which reads
// skip) would hold a dial or an accepted connection for as long as it
// liked: a local process squatting a peer's unix socket held copies in D
// state for minutes.
func (c *conn) armBy(deadline time.Time) func() {
	return func() { c.c.SetReadDeadline(deadline) }
}

// localPID is this process's id when it offers a unix socket (hello.PID).
func (s *Service) localPID() int {
	if s.localName == "" {
		return 0
	}
	return os.Getpid()
}

// localNS is this process's namespaces when it offers a unix socket
// (hello.NS).
func (s *Service) localNS() string {
	if s.localName == "" {
		return ""
	}
	return s.ns
}

// namespaces names this process's network and PID namespaces ("" when
// /proc does not say).
func namespaces() string {
	netNS, err1 := os.Readlink("/proc/self/ns/net")
	pidNS, err2 := os.Readlink("/proc/self/ns/pid")
	if err1 != nil || err2 != nil {
		return ""
	}
	return netNS + " " + pidNS
}

// handshake authenticates an accepted connection.
func (s *Service) handshake(nc net.Conn) (*conn, error) {
	c := newConn(nc, s.cfg.Timeout, remoteLabel(nc))
	c.c.spin = s.cfg.Spin
	arm := c.armBy(time.Now().Add(s.cfg.Timeout))
	typ, p, err := c.recvArmed(arm)
	if err != nil {
		return nil, err
	}
	var h hello
	if typ != frameHello || json.Unmarshal(p, &h) != nil {
		return nil, fmt.Errorf("%s: no hello: %w", c.peer, ErrFrame)
	}
	if h.Version != ProtocolVersion {
		err := &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("protocol version mismatch: peer %s speaks %d, node %s speaks %d", h.Name, h.Version, s.cfg.Name, ProtocolVersion)}
		c.sendError(err)
		return nil, err
	}
	c.peer = h.Name
	sn := nonce()
	if err := c.sendJSON(frameChallenge, challenge{Version: ProtocolVersion, Name: s.cfg.Name, HostID: s.cfg.HostID, Nonce: sn, Proof: proof(s.cfg.Secret, "server", h.Nonce, sn, h.Name, s.cfg.Name), Instance: s.instance, Imports: s.importKinds(), NoSecret: len(s.cfg.Secret) == 0, UCX: s.rmaAddress(), NoChecksum: s.cfg.Checksum == ChecksumNone, XXH3: s.cfg.Checksum.takesXXH3(), Recheck: true, Bind: true, Local: s.localName, PID: s.localPID(), NS: s.localNS()}); err != nil {
		return nil, err
	}
	var a authMsg
	if err := c.recvJSONArmed(frameAuth, &a, arm); err != nil {
		// The client's reason, when it refused our proof (secretMismatch),
		// is in err: this node's log says it, not a bare EOF.
		return nil, err
	}
	if !hmac.Equal(a.Proof, proof(s.cfg.Secret, "client", h.Nonce, sn, h.Name, s.cfg.Name)) {
		none := len(s.cfg.Secret) == 0
		err := &Error{Errno: syscall.EACCES, Msg: secretMismatch(s.cfg.Name, none, h.NoSecret, h.Name, remoteLabel(nc))}
		c.sendError(&Error{Errno: syscall.EACCES, Msg: secretMismatch(h.Name, h.NoSecret, none, s.cfg.Name, nc.LocalAddr().String()) + " (refused by " + s.cfg.Name + ")"})
		return nil, err
	}
	if err := c.sendJSON(frameOK, reply{}); err != nil {
		return nil, err
	}
	c.hostID = h.HostID
	c.instance, c.imports, c.noChecksum, c.xxh3, c.recheck, c.binds = h.Instance, h.Imports, h.NoChecksum, h.XXH3, h.Recheck, h.Bind
	c.max = MaxFrame
	s.notePeer(h.Name, h.HostID, h.Instance, s.checksumFor(c))
	c.name = h.Name
	s.noteRMA(h.Name, h.Instance, h.UCX)
	return c, nil
}

// secretMismatch is the refusal of a handshake whose proof did not match,
// as node self tells it about peer at addr, each saying whether it has no
// secret: which of the two has none, or that theirs differ. Neither side
// can tell which of two secrets is the wrong one.
func secretMismatch(self string, selfNone, peerNone bool, peer, addr string) string {
	switch {
	case selfNone && peerNone:
		return fmt.Sprintf("neither node %s nor peer %s at %s has a shared secret (--secret-file)", self, peer, addr)
	case peerNone:
		return fmt.Sprintf("peer %s at %s has no shared secret (--secret-file) and node %s has one", peer, addr, self)
	case selfNone:
		return fmt.Sprintf("node %s has no shared secret (--secret-file) and peer %s at %s has one", self, peer, addr)
	}
	return fmt.Sprintf("node %s and peer %s at %s hold different shared secrets (--secret-file): the proofs do not match", self, peer, addr)
}

// proof is HMAC-SHA256(secret, role, both nonces, both names): the secret
// never crosses the wire, and a proof cannot be replayed on another
// connection (fresh nonces) or reflected to the other role.
func proof(secret []byte, role string, clientNonce, serverNonce []byte, client, server string) []byte {
	m := hmac.New(sha256.New, secret)
	for _, part := range [][]byte{[]byte(role), clientNonce, serverNonce, []byte(client), []byte(server)} {
		var n [4]byte
		n[0], n[1], n[2], n[3] = byte(len(part)>>24), byte(len(part)>>16), byte(len(part)>>8), byte(len(part))
		m.Write(n[:])
		m.Write(part)
	}
	return m.Sum(nil)
}

// nonceLen is the bytes of a nonce: a handshake's, and a transfer token.
const nonceLen = 32

// nonce returns nonceLen random bytes.
func nonce() []byte {
	b := make([]byte, nonceLen)
	rand.Read(b)
	return b
}
