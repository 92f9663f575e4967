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
			p.NoChecksum = s.cfg.NoChecksum && m.noChecksum
			p.SameHost = s.cfg.HostID != "" && m.hostID == s.cfg.HostID
			if p.SameHost {
				p.Local = m.local
			}
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
	noChecksum       bool // the peer runs --checksum none
	// local is the peer's abstract unix socket (hello.Local), "" when it
	// offered none or a dial there failed (forgetLocal).
	local string
	at    time.Time
}

// notePeer records an authenticated handshake with peer name, whose hello
// or challenge gave its host id, instance and unix socket (stats:
// PeerReport.Reached).
func (s *Service) notePeer(name, hostID, instance string, noChecksum bool, local string) {
	s.metMu.Lock()
	defer s.metMu.Unlock()
	if s.met == nil {
		s.met = map[string]peerMet{}
	}
	s.met[name] = peerMet{hostID: hostID, instance: instance, noChecksum: noChecksum, local: local, at: time.Now()}
}

// localFor is the unix socket to dial peer on: the one its last handshake
// offered, when its host id is this node's (the IPC path's condition: a
// peer given another --host-id on this machine stays on TCP); else "".
func (s *Service) localFor(peer string) string {
	s.metMu.Lock()
	defer s.metMu.Unlock()
	m := s.met[peer]
	if s.cfg.HostID == "" || m.hostID != s.cfg.HostID || !strings.HasPrefix(m.local, localPrefix) {
		return ""
	}
	return m.local
}

// forgetLocal drops peer's unix socket name after a dial there failed (the
// peer restarted under a new one, or lives in another network namespace):
// its next TCP handshake says again what to use.
func (s *Service) forgetLocal(peer, name string) {
	s.metMu.Lock()
	defer s.metMu.Unlock()
	if m, ok := s.met[peer]; ok && m.local == name {
		m.local = ""
		s.met[peer] = m
	}
}
