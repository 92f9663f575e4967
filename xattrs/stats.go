package xattrs

import "time"

// Stats is the JSON document read from StatsName on the root: what lives
// now, then the peer service's completed copies, its transfers and its
// configured peers (zeros and empty collections when the node has no peer
// service). The daemon fills Live from its tensor store and the rest from
// its peer service (package transfer's Stats).
type Stats struct {
	// Live counts what exists now; all 0 when nothing is allocated,
	// imported or in flight.
	Live Live `json:"live"`
	// Devices are the daemon's devices with their capacity and use in
	// bytes, the default device first.
	Devices []DeviceUse `json:"devices"`
	// Copies counts completed copies by the path they took.
	Copies Copies `json:"copies"`
	// Transfers are the copies in flight and the latest ones.
	Transfers Transfers `json:"transfers"`
	// Peers are the nodes this one reaches by name: the configured ones
	// (--peer) and, with --etcd, the cluster's view (this node's own
	// record included, marked Self).
	Peers map[string]Peer `json:"peers"`
	// Connections counts the authenticated peer connections open between
	// copies.
	Connections Connections `json:"connections"`
	// Cluster is the state of the etcd view (--etcd); nil (absent)
	// without one.
	Cluster *Cluster `json:"cluster,omitempty"`
	// Imports counts lookups in the import cache of other daemons' (same
	// host) allocations opened for IPC copies.
	Imports ImportCache `json:"imports"`
	// Errors are the refused attribute sets and actions: how many, and
	// the latest with their reasons.
	Errors Errors `json:"errors"`
	// Truncated: the daemon dropped the peers from the document to keep
	// it under 64 KiB (its recent lists were emptied first).
	Truncated bool `json:"truncated,omitempty"`
	// PID is the process id of the daemon serving the mount (in its PID
	// namespace): tensorfs unmount waits for it to exit.
	PID int `json:"pid,omitempty"`
}

// DeviceUse is one entry of Stats' devices: a device's name ("host",
// "cuda:0"), the tensors placed on it, the bytes tensorfs holds there and
// may hold (its memory, or --max-memory when smaller), and whether it is
// the default device.
type DeviceUse struct {
	Name    string `json:"name"`
	Tensors int    `json:"tensors"`
	Used    int64  `json:"used"`
	Total   int64  `json:"total"`
	Default bool   `json:"default,omitempty"`
}

// Errors is the "errors" object of Stats: refusals since start, and the
// last 16, oldest first.
type Errors struct {
	Total  int64     `json:"total"`
	Recent []Refusal `json:"recent"`
}

// Refusal is one refused attribute set or action: when (UTC), by which
// process (the caller's thread id), on which mount-relative path and
// attribute (full name), the errno's name ("EINVAL") and the reason.
type Refusal struct {
	// ID numbers the refusals from 1, so that a client tells the ones
	// after its call from earlier ones.
	ID     int64     `json:"id"`
	Time   time.Time `json:"time"`
	PID    uint32    `json:"pid"`
	Path   string    `json:"path"`
	Attr   string    `json:"attr"`
	Errno  string    `json:"errno"`
	Reason string    `json:"reason"`
}

// Refusal returns the latest refusal of attr on path (mount-relative) by
// pid (any pid when 0), or false: how a client finds the reason for the
// errno it just got.
func (s *Stats) Refusal(pid uint32, path, attr string) (Refusal, bool) {
	for i := len(s.Errors.Recent) - 1; i >= 0; i-- {
		r := s.Errors.Recent[i]
		if r.Path == path && r.Attr == attr && (pid == 0 || r.PID == pid) {
			return r, true
		}
	}
	return Refusal{}, false
}

// Live is the "live" object of Stats: counts of what the daemon holds now.
type Live struct {
	// Tensors is the number of tensors not yet released.
	Tensors int `json:"tensors"`
	// Regions is the number of memory regions not yet released.
	Regions int `json:"regions"`
	// Exports is the number of IPC exports not yet revoked.
	Exports int `json:"exports"`
	// Imports is the number of other daemons' allocations this node holds
	// open now.
	Imports int `json:"imports"`
	// Leases is the number of leases held on this daemon's exports (one
	// per open file handle or importer).
	Leases int `json:"leases"`
	// Pins is the number of pins held on memory regions (by copies in
	// flight).
	Pins int `json:"pins"`
	// Bytes is the device memory held, on all devices, in bytes
	// (registered memory tensorfs did not allocate is not counted).
	Bytes int64 `json:"bytes"`
	// Bound is the number of bindings peers of this host hold on this
	// daemon's tensors, to write them in place one-sided; Bindings the
	// number this daemon holds on peers' tensors (DESIGN.md "In-place
	// copies"; transfer/bind.go). A binding lasts until its tensor is
	// resized, unlinked or renamed, or the peers' lease channel ends.
	Bound    int64 `json:"bound"`
	Bindings int   `json:"bindings"`
}

// Copies is the "copies" object of Stats: completed copies by path
// (Paths' fields, inline), and by mode, bytes and descriptors.
type Copies struct {
	Paths
	// InPlace counts, by path, the copies whose every descriptor was
	// written in place (DESIGN.md "In-place copies").
	InPlace Paths `json:"in_place"`
	// Bytes is the bytes those copies moved, by path.
	Bytes Paths `json:"bytes"`
	// Descriptors is how many descriptors (whole tensors, or in-place
	// ranges) those copies carried.
	Descriptors int64 `json:"descriptors"`
	// Rechecked counts the TCP copies this node ran again from buffers
	// after a chunk failed its checksum where its bytes lie (a process
	// writing the source or destination through its mapping, another
	// copy into the same bytes, or corruption), once each, on the node
	// that asked for the copy.
	Rechecked int64 `json:"rechecked"`
}

// Paths is a count by the path a copy took.
type Paths struct {
	// Local counts copies inside one mount.
	Local int64 `json:"local"`
	// IPC counts copies between daemons of one host, through an IPC
	// import of the source's allocation.
	IPC int64 `json:"ipc"`
	// TCP counts copies over the network to or from a peer, on
	// tensorfs's TCP streams.
	TCP int64 `json:"tcp"`
	// UCX counts copies to or from a peer of another host whose bytes
	// moved one-sided on its UCX endpoint (a build with UCX).
	UCX int64 `json:"ucx"`
}

// Transfers is the "transfers" object of Stats.
type Transfers struct {
	// Active is the number of transfers running now.
	Active int64 `json:"active"`
	// Recent are the latest transfers, running or finished, oldest first
	// (the daemon keeps the last 16).
	Recent []Record `json:"recent"`
}

// Record is one transfer in Transfers.Recent: progress while it runs, the
// outcome after.
type Record struct {
	// ID is the record's number in this daemon, from 1, never reused: a
	// program follows a transfer by it.
	ID uint64 `json:"id"`
	// PID is the process that asked for the copy (through the mount), 0
	// for a transfer a peer asked for (omitted when 0).
	PID int `json:"pid,omitempty"`
	// Src and Dst are the copy's source and destination as the daemon
	// names them: a path in this mount, or a peer path "NAME:/path".
	Src string `json:"src"`
	Dst string `json:"dst"`
	// Path is the way the copy took: "local", "ipc", "tcp" or "ucx".
	Path string `json:"path"`
	// Transports, on a "ucx" copy, are what UCX's lanes to the peer run
	// on ("tcp/lo", "posix/memory", "rc_mlx5/mlx5_0:1").
	Transports []string `json:"transports,omitempty"`
	// BytesDone is how many bytes have moved so far.
	BytesDone int64 `json:"bytes_done"`
	// BytesTotal is the bytes the transfer moves in all, 0 while unknown
	// (a pull learns it from the peer).
	BytesTotal int64 `json:"bytes_total"`
	// Tensors is how many descriptors the transfer carries (whole
	// tensors, or in-place ranges).
	Tensors int64 `json:"tensors"`
	// Mode is "whole" (every descriptor replaces its tensor), "in_place"
	// (every one is written into an existing tensor) or "mixed"; absent
	// while unknown (a pull before the peer's reply).
	Mode string `json:"mode,omitempty"`
	// Error is the failure's text, "" while running and on success.
	Error string `json:"error"`
	// Streams is how many TCP streams carry the data (1 for local and IPC
	// copies).
	Streams int64 `json:"streams"`
	// Checksum, on a "tcp" copy, is the check its chunks carried: "xxh3",
	// "crc32c" or "none", as this node sent them, or as the first chunk of
	// each stream it received said; absent before the first chunk and on
	// other paths.
	Checksum string `json:"checksum,omitempty"`
	// PhaseUS is, on the node that received the tensors, the copy's time
	// by phase; nil (absent) on the sending side.
	PhaseUS *Phases `json:"phase_us,omitempty"`
	// TookUS is how long the transfer took on this node, from its start
	// to its end (success or failure), in microseconds; 0 (absent) while
	// it runs, so a non-zero TookUS means the record is final.
	TookUS int64 `json:"took_us,omitempty"`
}

// Phases is a received transfer's time by phase, in microseconds.
type Phases struct {
	// Prepare is the time spent allocating and registering the
	// destination's temporaries.
	Prepare int64 `json:"prepare"`
	// Data is the time spent moving the bytes.
	Data int64 `json:"data"`
	// Commit is the time spent renaming the temporaries into place.
	Commit int64 `json:"commit"`
}

// Peer is one peer in Stats.Peers. Without --etcd only Addr is set.
type Peer struct {
	// Addr is the peer's address, host:port, as configured (--peer) or
	// registered in etcd.
	Addr string `json:"addr"`
	// Source is "peer" (a --peer, which wins for its name) or "etcd";
	// absent without --etcd.
	Source string `json:"source,omitempty"`
	// Self marks this node's own record in the etcd view.
	Self bool `json:"self,omitempty"`
	// HostID is the node's host identity (its boot id or --host-id).
	HostID string `json:"host_id,omitempty"`
	// SameHost: the node is on this node's host (copies take the IPC path).
	SameHost bool `json:"same_host,omitempty"`
	// Instance is the id of the node's current run; a restart changes it.
	Instance string `json:"instance,omitempty"`
	// Transports are the ways the node moves bytes ("tcp").
	Transports []string `json:"transports,omitempty"`
	// UCX are the transports of this node's UCX endpoint to the peer
	// ("tcp/lo", "rc_mlx5/mlx5_0:1"), once a handshake with the peer has
	// made one (a build with UCX on both sides); absent without.
	UCX []string `json:"ucx,omitempty"`
	// UCXOneSided says that endpoint reaches the peer's registered
	// memory by itself (an RMA lane on RDMA verbs, say); false where UCX
	// emulates puts and gets (its tcp, and its shared memory in UCX 1.13).
	UCXOneSided bool `json:"ucx_one_sided,omitempty"`
	// UCXPeerFailure says that endpoint detects a dead peer (UCX's peer
	// error handling: RDMA verbs, tcp; not shared memory).
	UCXPeerFailure bool `json:"ucx_peer_failure,omitempty"`
	// UCXCarries says copies with the peer move their bytes on that
	// endpoint: one-sided and detecting a dead peer, or any endpoint
	// with --ucx-any-endpoint; false: they stay on TCP.
	UCXCarries bool `json:"ucx_carries,omitempty"`
	// Since is when the node's current run started (RFC 3339, UTC).
	Since string `json:"since,omitempty"`
	// Stale: etcd is unreachable and this entry is from the last view.
	Stale bool `json:"stale,omitempty"`
	// Reached, for a --peer, is when this node last completed an
	// authenticated handshake with it (RFC 3339, UTC); HostID, SameHost
	// and Instance are then from that handshake. Absent until one has.
	Reached string `json:"reached,omitempty"`
	// Checksum, for a peer reached so, is the check every chunk of a
	// TCP copy with it carries, both ways: "xxh3", "crc32c" (a peer that
	// runs --checksum crc32c, or a release before XXH3) or "none" (both
	// nodes run --checksum none).
	Checksum string `json:"checksum,omitempty"`
	// Local, for a peer of this host reached so, is its abstract unix
	// socket ("@tensorfs-" and its instance), which connections to it use
	// instead of TCP; absent: they use TCP.
	Local string `json:"local,omitempty"`
}

// Cluster is the "cluster" object of Stats: the etcd view's state.
type Cluster struct {
	// Backend is "etcd".
	Backend string `json:"backend"`
	// Endpoints are the etcd endpoints, as given to --etcd.
	Endpoints []string `json:"endpoints"`
	// Cluster is the cluster's name (--cluster).
	Cluster string `json:"cluster"`
	// State is "connected" or "lost" (etcd did not answer: peers are
	// resolved from the last view while the daemon retries).
	State string `json:"state"`
	// Since is when State began (RFC 3339, UTC).
	Since string `json:"since"`
	// Error is the last failure while State is "lost".
	Error string `json:"error,omitempty"`
	// Registered is whether this node's record is in etcd under a live
	// lease, as last seen.
	Registered bool `json:"registered"`
	// Nodes is how many live records the view holds, this node's included.
	Nodes int `json:"nodes"`
	// Revision is the etcd revision the view reflects.
	Revision int64 `json:"revision"`
}

// ImportCache is the "imports" object of Stats: lookups in the import
// cache. A hit reuses an open import; a miss opens one (a CUDA IPC open
// costs about 9.4 ms on an H200).
type ImportCache struct {
	// Hits counts lookups that reused an open import.
	Hits int64 `json:"hits"`
	// Misses counts lookups that opened an import.
	Misses int64 `json:"misses"`
}

// Connections is the "connections" object of Stats.
type Connections struct {
	// Idle is how many connections this node keeps open to its peers for
	// its next copies (--idle-timeout), kept alive by keepalives.
	Idle int64 `json:"idle"`
	// Waiting is how many of its peers' idle connections this node serves,
	// waiting for their next request.
	Waiting int64 `json:"waiting"`
}
