package transfer

import (
	"encoding/binary"
	"fmt"
)

// Meta is one descriptor of a transfer: NBytes bytes into the destination
// tensor at Rel, either a whole new tensor (replacing what is there) or,
// InPlace, bytes [Off, Off+NBytes) of the existing one. A transfer is a
// list of them, moved by one prepare -> move -> commit (Deliver); the data
// frames address descriptor i's bytes [0, NBytes).
type Meta struct {
	// Rel is the tensor's path relative to the transfer's root: "" when the
	// root is the tensor itself, else "a/b" under the root directory.
	Rel string `json:"rel"`
	// DType is the canonical dtype ("F32"); Shape is comma-separated dims:
	// the source's (a whole-tensor destination gets them; an in-place one
	// keeps its own).
	DType string `json:"dtype"`
	Shape string `json:"shape"`
	// NBytes is the descriptor's length in bytes: the source tensor's
	// size, or its range's.
	NBytes int64 `json:"nbytes"`
	// InPlace: write into the existing tensor at Rel, at byte Off, without
	// allocating, renaming or revoking anything (DESIGN.md "In-place
	// copies"); the range must lie inside it.
	InPlace bool  `json:"in_place,omitempty"`
	Off     int64 `json:"off,omitempty"`
	// Exact, with InPlace: the destination must hold exactly NBytes (the
	// tensors of a directory's "@0" weight update).
	Exact bool `json:"exact,omitempty"`
	// Line, on a whole tensor of a put rooted at a directory, says it is
	// one line of a call (a batch's, or a copy_to's of several lines, sent
	// to the peer together, rooted at "/") that names its destination
	// exactly: the destination's parent must exist (ENOENT, ENOTDIR), as a
	// single copy's must; a tree's tensors get the directories they need.
	Line bool `json:"line,omitempty"`
	// Spans, with InPlace (Off 0, not Exact), make the descriptor a range
	// list: its NBytes bytes are the spans' (Span), each from its own
	// offset of the source into its own offset of the destination; the
	// lines of one call between one source tensor and one destination
	// tensor travel as one such descriptor. Nil for one range.
	Spans []Span `json:"-"`
}

// request is what a client asks (client -> server).
type request struct {
	// Op is "put" (the client sends tensors to Path) or "get" (the server
	// sends the tensors at Path); "check-put" and "check-get" are the same
	// requests' checks alone: the server answers as it would before any
	// byte moves (a put's destinations prepared and let go; a get's
	// sources opened and closed, its reply their descriptors) and moves
	// nothing (Service.Check, Service.CheckPull).
	Op   string `json:"op"`
	Path string `json:"path"`
	// Dir says the put's source is a directory tree (Path names a directory).
	Dir bool `json:"dir,omitempty"`
	// Tensors and IPC travel as a table after the JSON (encodeMsg).
	Tensors []Meta `json:"-"`
	// IPC, on a put between daemons of one host, gives the exported memory
	// of each tensor: the server copies from it and no bytes cross the
	// socket. On a get, IPCOK asks the server for the same.
	IPC   []IPCDesc `json:"-"`
	IPCOK bool      `json:"ipc_ok,omitempty"`
	// Streams is how many parallel TCP streams the client would use for
	// the data (put and get; at most maxStreams); the server answers with
	// the number it takes (reply.Streams) and a Token that the extra
	// connections present in a "join" request (Op "join", Path "/").
	Streams int `json:"streams,omitempty"`
	// Chunk is the sender's bytes per data frame, on a put: with several
	// streams, chunk j of a tensor is its bytes [j*Chunk, (j+1)*Chunk).
	Chunk int `json:"chunk,omitempty"`
	// Token names the transfer that a join request's connection joins.
	Token []byte `json:"token,omitempty"`
	// Early, on a put of several streams, says its data follows the
	// request at once, on this connection and on the extra streams that
	// join with Token (the sender's own, then), without the server's
	// go-ahead; on a join, that the joiner's data follows the join request
	// at once (the server answers nothing, unless to refuse it and hang
	// up). It saves a multi-stream put the go-ahead's round trip and the
	// join's: 150-280 µs were spent around an 8 MiB copy's data phase on
	// an H100 host before it (2026-12-06).
	Early bool `json:"early,omitempty"`
	// Recheck, on a TCP put or get with a checksum (both nodes said
	// hello.Recheck), lets each side sum the chunks where their bytes lie:
	// the sender from a host-memory source's own memory, sent from there
	// (no copy into a buffer), the receiver in the destination's memory,
	// read straight into it. A process writing either through its mapping,
	// or another copy into the same bytes, can then make a chunk's sum
	// disagree with its bytes, which a snapshot cannot: a mismatch fails
	// the copy with wireError.Recheck set, and the client runs it again
	// without Recheck, summed from buffers, where a mismatch is
	// corruption (EIO).
	Recheck bool `json:"recheck,omitempty"`
	// Range, on a get, names bytes of the tensor at Path (not of a
	// directory): the reply's one descriptor is that range. InPlace says
	// the puller writes what it gets in place (for the sender's records).
	Range   *Range `json:"range,omitempty"`
	InPlace bool   `json:"in_place,omitempty"`
	// RMA: the bytes may move one-sided on UCX. On a get, the client
	// reads them from the server's memory when the server answers with
	// reply.RMA. On a put, RMASrc and RMASrcAt name the client's memory
	// the sources are in (as reply.RMA and reply.RMAAt do a get's), and
	// the server reads them with its one-sided endpoint to the client and
	// answers once it has committed (reply.RMADone); a server without one
	// answers as for a TCP put that is not eager (a go-ahead), and one
	// without RMA ignores them alike.
	RMA      bool        `json:"rma,omitempty"`
	RMASrc   []rmaRegion `json:"rma_src,omitempty"`
	RMASrcAt []rmaTarget `json:"rma_src_at,omitempty"`
}

// IPCDesc is where a tensor's bytes are in another process of this host.
type IPCDesc struct {
	// Handle is the export's handle ("memfd:/proc/PID/fd/N", or "cuda:" and
	// 128 hex digits); it opens the whole allocation.
	Handle string `json:"handle"`
	// Offset is the tensor's first byte in the exported allocation.
	Offset int64 `json:"offset"`
	// Alloc is the exporter's never-reused id of the allocation: with the
	// exporter's Instance, the key of the importer's cache.
	Alloc uint64 `json:"alloc"`
	// Export and Generation are the tensor's ipc_id and generation now.
	Export     uint64 `json:"export"`
	Generation uint64 `json:"generation"`
	// Leased: the exporter holds a lease for the importer on Export over
	// their lease channel, so the importer may keep the allocation open
	// after the copy, until the exporter revokes it. Without it the
	// importer closes the allocation when the copy ends.
	Leased bool `json:"leased,omitempty"`
}

// reply is a frameOK payload.
type reply struct {
	Dir bool `json:"dir,omitempty"`
	// Tensors and IPC travel as a table after the JSON (encodeMsg).
	Tensors []Meta    `json:"-"`
	Copied  int       `json:"copied,omitempty"`
	IPC     []IPCDesc `json:"-"`
	// Streams, Token and Chunk answer a request's Streams: how many streams
	// the data takes (0 or 1: only this connection, chunks in order), the
	// token for the others to join with, and, on a get, the sender's chunk
	// size.
	Streams int    `json:"streams,omitempty"`
	Token   []byte `json:"token,omitempty"`
	Chunk   int    `json:"chunk,omitempty"`
	// RMA and RMAAt answer a get's RMA: the regions of the server's
	// memory that the sources' bytes are in (their tensors, or a staging
	// buffer), and where each descriptor is in them. The client reads the
	// bytes and says frameDone.
	RMA   []rmaRegion `json:"rma,omitempty"`
	RMAAt []rmaTarget `json:"rma_at,omitempty"`
	// RMADone ends a put whose bytes the server read one-sided (request
	// RMASrc): it has them all and committed.
	RMADone bool `json:"rma_done,omitempty"`
	// WaitGo, on the answer to a TCP get of whole tensors on several
	// streams or of more than goAheadMin bytes, says the data
	// waits for the client's go-ahead (a frameOK, or a frameError to
	// call it off): the client allocates its temporaries first (seconds
	// for gigabytes), under keepalives. Sent at once, the data would fill
	// the sockets and time the server's writes out, and its extra streams
	// would join after the server stopped waiting for them (a 3 GiB pull
	// under --timeout 300ms failed so, 2026-12-06).
	WaitGo bool `json:"wait_go,omitempty"`
}

// doneMsg ends a data stream.
type doneMsg struct {
	Chunks int64 `json:"chunks"`
}

// progressMsg is the optional payload of a frameKeepalive from the
// receiving node of an IPC put: the bytes it has copied so far.
type progressMsg struct {
	BytesDone int64 `json:"bytes_done"`
}

// dataHeaderLen is the chunk header of a data frame: tensor index (4 bytes;
// its top two bits say which sum the chunk carries: noSumFlag, xxh3Flag, or
// neither for CRC32C), byte offset in the tensor (8), the sum of the bytes
// (4; 0 without), all big-endian.
const dataHeaderLen = 16

// noSumFlag marks a chunk header whose chunk goes without a sum, and
// xxh3Flag one whose sum is XXH3's (Service.checksumFor); a descriptor
// table never reaches 2^30 tensors (a request is one frame, at most
// MaxFrame bytes, and each tensor's meta takes more than one).
const (
	noSumFlag = 1 << 31
	xxh3Flag  = 1 << 30
)

type chunkHeader struct {
	index  uint32
	offset int64
	sum    uint32   // of kind kind
	kind   Checksum // from the flags
}

func putChunkHeader(b []byte, h chunkHeader) {
	idx := h.index
	switch h.kind {
	case ChecksumNone:
		idx |= noSumFlag
	case ChecksumXXH3:
		idx |= xxh3Flag
	}
	binary.BigEndian.PutUint32(b[0:4], idx)
	binary.BigEndian.PutUint64(b[4:12], uint64(h.offset))
	binary.BigEndian.PutUint32(b[12:16], h.sum)
}

// parseChunk splits a data frame's payload. Errors: ErrFrame when it is
// shorter than its header, its offset is negative or it has both sum
// flags.
func parseChunk(p []byte) (chunkHeader, []byte, error) {
	if len(p) < dataHeaderLen {
		return chunkHeader{}, nil, fmt.Errorf("data frame of %d bytes: %w", len(p), ErrFrame)
	}
	idx := binary.BigEndian.Uint32(p[0:4])
	h := chunkHeader{
		index:  idx &^ (noSumFlag | xxh3Flag),
		offset: int64(binary.BigEndian.Uint64(p[4:12])),
		sum:    binary.BigEndian.Uint32(p[12:16]),
		kind:   ChecksumCRC32C,
	}
	switch idx & (noSumFlag | xxh3Flag) {
	case noSumFlag:
		h.kind = ChecksumNone
	case xxh3Flag:
		h.kind = ChecksumXXH3
	case noSumFlag | xxh3Flag:
		return chunkHeader{}, nil, fmt.Errorf("chunk header with both sum flags: %w", ErrFrame)
	}
	if h.offset < 0 {
		return chunkHeader{}, nil, fmt.Errorf("chunk offset %d: %w", h.offset, ErrFrame)
	}
	return h, p[dataHeaderLen:], nil
}
