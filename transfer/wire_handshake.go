package transfer

// hello opens a connection (client -> server).
type hello struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	HostID  string `json:"host_id"`
	Nonce   []byte `json:"nonce"`
	// Instance is the node's identity for this run (fresh random hex at
	// every start): importers key their caches by it, so a restarted peer's
	// allocation ids can never alias the old ones.
	Instance string `json:"instance"`
	// Imports lists the IPC handle kinds the node can open ("memfd",
	// "cuda"): an exporter offers only those.
	Imports []string `json:"imports,omitempty"`
	// NoSecret says the node runs without a shared secret, so that a
	// refused handshake names the side that has none.
	NoSecret bool `json:"no_secret,omitempty"`
	// UCX is the node's UCX worker address (RMA.Address), absent when it
	// has none; used only once the handshake has authenticated the peer.
	UCX []byte `json:"ucx,omitempty"`
	// NoChecksum says the node goes without a checksum on its TCP copies
	// (ChecksumNone); a copy does only when both ends do.
	NoChecksum bool `json:"no_checksum,omitempty"`
	// XXH3 says the node checks chunks summed with XXH3 and takes them
	// (it runs ChecksumXXH3 or ChecksumNone): a copy with it carries XXH3
	// unless the other end runs ChecksumCRC32C (checksumWith). Absent
	// from releases before XXH3, which get CRC32C.
	XXH3 bool `json:"xxh3,omitempty"`
	// Recheck says the node takes copies whose chunks are summed where
	// their bytes lie (request.Recheck), and reports a mismatch in one as
	// such (wireError.Recheck). Absent from releases before it: their
	// copies are summed from buffers, as before.
	Recheck bool `json:"recheck,omitempty"`
	// Bind says the node takes frameBind and frameBound on its lease
	// channels (one-sided in-place copies between daemons of one host:
	// bind.go). Absent from releases before them.
	Bind bool `json:"bind,omitempty"`
	// Local is the node's abstract unix socket ("@tensorfs-" and its
	// instance), absent when it has none: a peer of the same host id
	// connects there instead of over TCP (Service.dial).
	Local string `json:"local,omitempty"`
	// PID is the node's process id, with Local: a client of the socket
	// checks that this process is the one listening there (SO_PEERCRED)
	// before it says anything.
	PID int `json:"pid,omitempty"`
	// NS names the node's network and PID namespaces (the links of
	// /proc/self/ns/net and pid), with Local: the socket is used only
	// between nodes of the same two, where its name is the node's (an
	// abstract name is per network namespace) and PID means the same
	// process on both sides.
	NS string `json:"ns,omitempty"`
}

// challenge answers hello (server -> client) and proves the server knows the
// secret.
type challenge struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	HostID  string `json:"host_id"`
	Nonce   []byte `json:"nonce"`
	Proof   []byte `json:"proof"`
	// Instance, Imports, NoSecret, UCX, NoChecksum, XXH3, Recheck, Bind, Local,
	// PID and NS: as in hello.
	Instance   string   `json:"instance"`
	Imports    []string `json:"imports,omitempty"`
	NoSecret   bool     `json:"no_secret,omitempty"`
	UCX        []byte   `json:"ucx,omitempty"`
	NoChecksum bool     `json:"no_checksum,omitempty"`
	XXH3       bool     `json:"xxh3,omitempty"`
	Recheck    bool     `json:"recheck,omitempty"`
	Bind       bool     `json:"bind,omitempty"`
	Local      string   `json:"local,omitempty"`
	PID        int      `json:"pid,omitempty"`
	NS         string   `json:"ns,omitempty"`
}

// authMsg proves the client knows the secret (client -> server).
type authMsg struct {
	Proof []byte `json:"proof"`
}
