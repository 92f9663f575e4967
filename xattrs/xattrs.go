// Package xattrs is the vocabulary of tensorfs's extended-attribute
// interface, shared by the daemon (package fs), its tools (cmd/tensorfs) and
// the tests, the way gocryptfs shares its ctlsock package between daemon and
// tools: the names under user.tensorfs. and the Go types of the JSON document
// that user.tensorfs.stats returns. DESIGN.md ("Extended attributes") is the
// specification; this package only names what it specifies, so a client
// written against these identifiers agrees with the daemon by construction.
//
// The package is a leaf: it imports nothing at all (its test alone imports
// tensor and transfer, to check the document against them), so any package,
// transfer included, may use it without an import cycle.
//
// # Why the stats types are defined here
//
// The daemon builds the document from two producers: the tensor store's live
// counts (tensor.Stats) and the peer service's copies, transfers and peers
// (transfer.Stats, with its RecordReport, PhaseReport and PeerReport). Reusing
// those types here would make this package import tensor and transfer, which
// a leaf must not, and moving them here would make transfer import a new
// internal package (transfer imports nothing internal, and is being
// restructured). So this package defines the document for its readers
// (cmd/tensorfs and the tests decode into Stats), with the same JSON field
// names and types, and the producers keep their own counters; fs assembles
// the document. The test TestStatsMatchesProducers in this package decodes
// the producers' JSON strictly (unknown fields are errors) into Stats and
// compares the round trip, so the two cannot drift apart silently.
package xattrs

// Prefix is the namespace of tensorfs's own extended attributes; every name
// below is Prefix followed by the attribute's short name. Other user.*
// names are ordinary attributes kept with the file.
const Prefix = "user.tensorfs."

// Tensor attributes, readable on a tensor file (and, for DType, Shape and
// Device, on a directory, where they are the template for files created in
// it).
const (
	// DType is the element type (rw): a safetensors dtype name such as
	// "F32", "BF16", "I64"; torch/numpy spellings ("float32") are accepted
	// on set and stored canonically. Set it before Shape; on an allocated
	// tensor a new dtype must keep NBytes.
	DType = Prefix + "dtype"
	// Shape is the tensor's dims (rw), comma-separated decimal ("2,4,2"),
	// "" for a scalar. Setting it on an unallocated file allocates; on an
	// allocated tensor it must keep NBytes (a reshape).
	Shape = Prefix + "shape"
	// Device is where the memory lives (rw on directories and unallocated
	// files, EBUSY on an allocated tensor): "host" or "cuda:N".
	Device = Prefix + "device"
	// MRID is the decimal id of the tensor's memory region (ro); unique for
	// the daemon's life, never reused. ENODATA before allocation.
	MRID = Prefix + "mr_id"
	// IPCID is the decimal id of the tensor's IPC export (ro); unique,
	// never reused. ENODATA before allocation.
	IPCID = Prefix + "ipc_id"
	// IPCHandle is the IPC handle of the allocation (ro, needs read
	// permission on the file): "cuda:" and 128 hex digits of the CUDA IPC
	// handle, or "memfd:/proc/PID/fd/N" for host memory.
	IPCHandle = Prefix + "ipc_handle"
	// IPCOffset is the decimal byte offset of the tensor inside the
	// exported allocation (ro; a sub-allocation's place in its arena).
	IPCOffset = Prefix + "ipc_offset"
	// NBytes is the tensor's size in bytes, decimal (ro).
	NBytes = Prefix + "nbytes"
	// Generation is the tensor's generation, decimal (ro): it changes when
	// the file's allocation is replaced.
	Generation = Prefix + "generation"
	// RKey is the hex of the memory region's packed UCX rkey (ro, needs
	// read permission on the file): what a peer's one-sided puts and gets
	// into it use (issue 17). ENODATA in a build without UCX (build tag
	// ucx), with --transport tcp, and for memory UCX does not map (GPU
	// memory when UCX has no CUDA support).
	RKey = Prefix + "rkey"
)

// Actions: write-only attributes whose setxattr starts an operation and
// returns when it is done (the errno is the outcome; error text and progress
// are in Stats).
const (
	// CopyTo, written with a peer path ("NAME:/path"), pushes this tensor
	// (or, on a directory, the whole tree) there.
	CopyTo = Prefix + "copy_to"
	// CopyFrom, written with a peer path, pulls into this file (or
	// directory).
	CopyFrom = Prefix + "copy_from"
	// Batch, written on the root directory only, runs many copies as one
	// pipelined transfer: lines of "SRC DST", each a peer path or a path in
	// this mount.
	Batch = Prefix + "batch"
	// Register, written on a file, registers memory tensorfs did not
	// allocate (see DESIGN.md, compat), replacing the file's own allocation.
	Register = Prefix + "register"
)

// StatsName is the attribute of the root directory (ro, root only; ENODATA
// elsewhere) whose value is the JSON document Stats, padded with spaces
// (JSON whitespace) to a multiple of 256 bytes, the last a newline.
const StatsName = Prefix + "stats"

// Settable names the attributes a set may name, for the refusal of an
// unknown one: the tensor (and template) attributes and the actions.
var Settable = []string{DType, Shape, Device, CopyTo, CopyFrom, Batch, Register}
