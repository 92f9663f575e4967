package transfer

import (
	"fmt"
	"sort"
	"strings"
	"syscall"
	"time"
)

// Resolver finds the address of a peer that Config.Peers does not name: a
// cluster directory such as package cluster's etcd view. The service asks
// it on every dial, so Resolve must answer from memory (no network round
// trip); Config.Peers wins for the names it gives.
type Resolver interface {
	// Resolve returns the named node's HOST:PORT. Errors: an *Error with
	// ENOENT for a name it does not know, EHOSTUNREACH for a node that has
	// left (its Msg says why and when); the dial returns it as it is.
	Resolve(name string) (addr string, err error)
	// Report describes the nodes it knows, by name, and its own state,
	// for stats.
	Report() ResolverReport
}

// ResolverReport is what a Resolver adds to stats: its nodes (merged into
// Stats.Peers, under the names Config.Peers does not give) and its state
// (Stats.Cluster).
type ResolverReport struct {
	// Nodes are the nodes it lists, by name (it may list only some: the
	// stats document is an xattr value, at most 64 KiB).
	Nodes map[string]PeerReport
	// State is the directory's state; nil when it has none to report.
	State *ClusterReport
}

// ClusterReport is the state of the cluster directory behind a Resolver
// (stats "cluster"; absent without one).
type ClusterReport struct {
	// Backend is the directory's kind: "etcd".
	Backend string `json:"backend"`
	// Endpoints are the directory's endpoints, as configured.
	Endpoints []string `json:"endpoints"`
	// Cluster is the cluster's name (--cluster).
	Cluster string `json:"cluster"`
	// State is "connected" or "lost" (the directory did not answer; peers
	// are resolved from the last view, marked stale, while it retries).
	State string `json:"state"`
	// Since is when State began (RFC 3339, UTC).
	Since string `json:"since"`
	// Error is the last failure's text while State is "lost", else "".
	Error string `json:"error,omitempty"`
	// Registered is whether this node's own record is in the directory
	// under a live lease, as last seen.
	Registered bool `json:"registered"`
	// Nodes is how many live records the view holds (this node's
	// included).
	Nodes int `json:"nodes"`
	// Revision is the directory's revision the view reflects.
	Revision int64 `json:"revision"`
}

// Known is nil when this node can resolve peer's name (resolve), so that a
// call naming several peers is refused before any of them writes. Errors:
// ENOENT for a name neither --peer nor the Resolver knows; the Resolver's.
func (s *Service) Known(peer string) error {
	_, err := s.resolve(peer)
	return err
}

// resolve returns peer's address: Config.Peers first, then the Resolver.
// Errors: ENOENT for a name neither knows; the Resolver's own.
func (s *Service) resolve(peer string) (string, error) {
	if addr, ok := s.cfg.Peers[peer]; ok {
		return addr, nil
	}
	if s.cfg.Resolver != nil {
		addr, err := s.cfg.Resolver.Resolve(peer)
		if err != nil {
			return "", err
		}
		return addr, nil
	}
	known := make([]string, 0, len(s.cfg.Peers))
	for n := range s.cfg.Peers {
		known = append(known, n)
	}
	sort.Strings(known)
	return "", &Error{Errno: syscall.ENOENT, Msg: fmt.Sprintf("unknown peer %q (known peers: %s; add one with --peer NAME=HOST:PORT)", peer, strings.Join(known, ", "))}
}

// peerReports is stats' peers: Config.Peers (source "peer"), then the
// Resolver's nodes under the other names; and the Resolver's state.
func (s *Service) peerReports() (map[string]PeerReport, *ClusterReport) {
	peers := map[string]PeerReport{}
	var state *ClusterReport
	if s.cfg.Resolver != nil {
		r := s.cfg.Resolver.Report()
		for name, p := range r.Nodes {
			peers[name] = p
		}
		state = r.State
	}
	s.metMu.Lock()
	for name, addr := range s.cfg.Peers {
		p := PeerReport{Addr: addr}
		if s.cfg.Resolver != nil {
			p.Source = "peer"
		}
		if m, ok := s.met[name]; ok {
			p.HostID, p.Instance, p.Reached = m.hostID, m.instance, m.at.UTC().Format(time.RFC3339)
			p.Checksum = m.checksum.String()
			p.SameHost = s.cfg.HostID != "" && m.hostID == s.cfg.HostID
		}
		if lp, ok := s.locals[name]; ok {
			p.Local = lp.sock
		}
		peers[name] = p
	}
	s.metMu.Unlock()
	for name, ep := range s.rmaEndpoints() {
		if p, ok := peers[name]; ok {
			p.UCX, p.UCXOneSided, p.UCXPeerFailure, p.UCXCarries = ep.transports, ep.oneSided, ep.guarded, s.carries(ep)
			peers[name] = p
		}
	}
	return peers, state
}

// peerMet is what a handshake with a peer said of it, and when.
type peerMet struct {
	hostID, instance string
	checksum         Checksum // of TCP copies with it (checksumWith)
	at               time.Time
}

// notePeer records an authenticated handshake with peer name, whose hello
// or challenge gave its host id and instance (stats: PeerReport.Reached),
// and sum, the checksum of TCP copies with it (PeerReport.Checksum).
func (s *Service) notePeer(name, hostID, instance string, sum Checksum) {
	s.metMu.Lock()
	defer s.metMu.Unlock()
	if s.met == nil {
		s.met = map[string]peerMet{}
	}
	s.met[name] = peerMet{hostID: hostID, instance: instance, checksum: sum, at: time.Now()}
}

// localPeer is a peer's abstract unix socket, as the challenge of a TCP
// handshake this node dialled to the peer's own address offered it: the
// socket, the instance and the process that listen there.
type localPeer struct {
	sock, instance string
	pid            int
}

// learnLocal records the unix socket c's peer offered, when c is a TCP
// connection this node dialled to peer's address and the peer answered
// as peer, from this host id and this process's network and PID
// namespaces, with a socket, its process id and an instance. Only such a handshake may say where peer is: a connection
// that came in under a name proves only that its node holds the secret
// (a second daemon of the same --name, say), and what it offered would
// send this node's copies for that name elsewhere. A socket that failed
// here (forgetLocal) is not learned again from the same instance.
func (s *Service) learnLocal(peer string, c *conn) {
	if s.cfg.HostID == "" || c.hostID != s.cfg.HostID || c.name != peer || c.pid <= 0 || c.instance == "" || !strings.HasPrefix(c.local, localPrefix) {
		return
	}
	// Another network namespace: the name here may be anyone's; another
	// PID namespace: its pid means another process here.
	if s.ns == "" || c.ns != s.ns {
		return
	}
	s.metMu.Lock()
	defer s.metMu.Unlock()
	if s.badLocal[peer] == c.local {
		return
	}
	if s.locals == nil {
		s.locals = map[string]localPeer{}
	}
	s.locals[peer] = localPeer{sock: c.local, instance: c.instance, pid: c.pid}
}

// localFor is the unix socket to dial peer on (learnLocal), if any.
func (s *Service) localFor(peer string) (localPeer, bool) {
	s.metMu.Lock()
	defer s.metMu.Unlock()
	lp, ok := s.locals[peer]
	return lp, ok
}

// forgetLocal drops peer's unix socket after a dial there failed; when
// the failure lasts (the socket is gone after a restart, unreachable from
// another network namespace, or held by another process), the socket is
// not learned again: the next TCP handshake that offers another one says
// what to use.
func (s *Service) forgetLocal(peer string, lp localPeer, lasting bool) {
	s.metMu.Lock()
	defer s.metMu.Unlock()
	if s.locals[peer] == lp {
		delete(s.locals, peer)
	}
	if !lasting {
		return
	}
	if s.badLocal == nil {
		s.badLocal = map[string]string{}
	}
	s.badLocal[peer] = lp.sock
}
