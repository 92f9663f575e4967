package transfer

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net"
	"syscall"
)

// authenticate runs the client half of the handshake on a dialed connection
// to the peer at addr: hello, the server's challenge and proof, then ours.
// Errors as for dial (EACCES, EPROTO, the connection's); the caller closes
// the connection on one.
func (s *Service) authenticate(c *conn, addr string) error {
	cn := nonce()
	if err := c.sendJSON(frameHello, hello{Version: ProtocolVersion, Name: s.cfg.Name, HostID: s.cfg.HostID, Nonce: cn, Instance: s.instance, Imports: s.importKinds()}); err != nil {
		return netErr(err)
	}
	var ch challenge
	if err := c.recvJSON(frameChallenge, &ch); err != nil {
		return err
	}
	if ch.Version != ProtocolVersion {
		return &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("protocol version mismatch: peer %s speaks %d, node %s speaks %d", c.peer, ch.Version, s.cfg.Name, ProtocolVersion)}
	}
	if !hmac.Equal(ch.Proof, proof(s.cfg.Secret, "server", cn, ch.Nonce, s.cfg.Name, ch.Name)) {
		return &Error{Errno: syscall.EACCES, Msg: fmt.Sprintf("peer %s at %s failed to prove the shared secret", c.peer, addr)}
	}
	if err := c.sendJSON(frameAuth, authMsg{Proof: proof(s.cfg.Secret, "client", cn, ch.Nonce, s.cfg.Name, ch.Name)}); err != nil {
		return netErr(err)
	}
	if err := c.recvJSON(frameOK, nil); err != nil {
		return err
	}
	c.hostID = ch.HostID
	c.instance, c.imports = ch.Instance, ch.Imports
	c.max = MaxFrame
	return nil
}

// handshake authenticates an accepted connection.
func (s *Service) handshake(nc net.Conn) (*conn, error) {
	c := newConn(nc, s.cfg.Timeout, nc.RemoteAddr().String())
	typ, p, err := c.recv()
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
	if err := c.sendJSON(frameChallenge, challenge{Version: ProtocolVersion, Name: s.cfg.Name, HostID: s.cfg.HostID, Nonce: sn, Proof: proof(s.cfg.Secret, "server", h.Nonce, sn, h.Name, s.cfg.Name), Instance: s.instance, Imports: s.importKinds()}); err != nil {
		return nil, err
	}
	var a authMsg
	if err := c.recvJSON(frameAuth, &a); err != nil {
		return nil, err
	}
	if !hmac.Equal(a.Proof, proof(s.cfg.Secret, "client", h.Nonce, sn, h.Name, s.cfg.Name)) {
		err := &Error{Errno: syscall.EACCES, Msg: fmt.Sprintf("peer %s (%s) failed to prove the shared secret", h.Name, nc.RemoteAddr())}
		c.sendError(err)
		return nil, err
	}
	if err := c.sendJSON(frameOK, reply{}); err != nil {
		return nil, err
	}
	c.hostID = h.HostID
	c.instance, c.imports = h.Instance, h.Imports
	c.max = MaxFrame
	return c, nil
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

func nonce() []byte {
	b := make([]byte, 32)
	rand.Read(b)
	return b
}
