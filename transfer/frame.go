package transfer

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// ProtocolVersion is the version of the wire protocol (these frames and the
// messages of wire_*.go); peers with another version are refused at the
// handshake with both versions named. 3: descriptor tables (wire_table.go)
// with in-place ranges; 4: range-list descriptors (Meta.Spans); 5: chunks
// without CRC32C (hello.NoChecksum) and early multi-stream puts
// (request.Early); 6: the checks of a call's lines on several peers
// (ops "check-put" and "check-get", Service.Check and CheckPull), and,
// within 6, chunks summed with XXH3 where both ends say so (hello.XXH3;
// a node of 6 that does not gets CRC32C, as before).
const ProtocolVersion = 6

// Frame types. Control frames carry JSON; data frames carry a binary chunk
// header (see dataHeaderLen) followed by the bytes.
const (
	frameHello     byte = 1 // client -> server: hello
	frameChallenge byte = 2 // server -> client: challenge (with the server's proof)
	frameAuth      byte = 3 // client -> server: auth (the client's proof)
	frameOK        byte = 4 // either way: a JSON reply
	frameError     byte = 5 // either way: a JSON wireError
	frameRequest   byte = 6 // client -> server: a JSON request
	frameData      byte = 7 // either way: one chunk of one tensor
	frameDone      byte = 8 // either way: the end of a data stream (JSON summary)
	// frameKeepalive says "still working" while a node prepares or commits a
	// large copy with nothing else to send, so that the peer's timeout
	// measures silence, not work. Receivers skip it. During an IPC put it
	// may carry a JSON progressMsg, so that the sender's stats (and
	// `tensorfs cp`'s progress bar) move with the copy; an empty one, or
	// one a node does not expect, is skipped all the same.
	frameKeepalive byte = 9
	// frameRevoke and frameRevoked travel only on a lease channel (a
	// connection turned over to leases by a "lease" request): see lease.go.
	frameRevoke  byte = 10
	frameRevoked byte = 11
	// frameBind and frameBound travel only on a lease channel, between
	// nodes whose handshakes said Bind: a binding asked for and granted
	// (or refused). See bind.go.
	frameBind  byte = 12
	frameBound byte = 13
)

// MaxFrame is the largest frame a node accepts (type byte and payload), in
// bytes: a 4 MiB chunk, its header, and room for control frames.
const MaxFrame = 4<<20 + 4096

// ErrFrame: a malformed frame (bad length or type), e.g. from a hostile or
// confused peer; the connection is dropped.
var ErrFrame = errors.New("malformed frame")

// writeFrame writes one frame: a 4-byte big-endian length of what follows,
// the type byte, then the payload.
func writeFrame(w io.Writer, typ byte, payload []byte) error {
	if len(payload)+1 > MaxFrame {
		return fmt.Errorf("frame of %d bytes: %w", len(payload)+1, ErrFrame)
	}
	var hdr [frameHeaderLen]byte
	putFrameHeader(hdr[:], typ, len(payload))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

// putFrameHeader writes the header of a frame of type typ and n payload
// bytes into b[:frameHeaderLen].
func putFrameHeader(b []byte, typ byte, n int) {
	binary.BigEndian.PutUint32(b[:4], uint32(n+1))
	b[4] = typ
}

// maxHandshakeFrame bounds frames before a peer has authenticated, in bytes:
// a stranger must not make the node allocate MaxFrame per connection.
const maxHandshakeFrame = 64 << 10

// frameNames names every frame type a node knows, for errors; the one frame
// reader (readFrameHeader, under readFrame and the data streams' reader)
// accepts exactly these, so that a new message is added here (its type
// above, its payload in a wire_*.go file) and every reader agrees on it.
// Which types a given exchange expects is that reader's own business.
var frameNames = [...]string{
	frameHello:     "hello",
	frameChallenge: "challenge",
	frameAuth:      "auth",
	frameOK:        "ok",
	frameError:     "error",
	frameRequest:   "request",
	frameData:      "data",
	frameDone:      "done",
	frameKeepalive: "keepalive",
	frameRevoke:    "revoke",
	frameRevoked:   "revoked",
	frameBind:      "bind",
	frameBound:     "bound",
}

// knownFrame reports whether typ is a frame type of the protocol.
func knownFrame(typ byte) bool { return int(typ) < len(frameNames) && frameNames[typ] != "" }

// frameHeaderLen is a frame's length (4 bytes, big-endian) and type byte.
const frameHeaderLen = 5

// readFrameHeader reads a frame's header and returns its type and the
// length of the payload that follows, for a reader that takes the payload
// itself (a data stream reads chunks straight into place). Errors: ErrFrame
// for a length of 0 or over max (type byte and payload) or an unknown type;
// io errors as they come.
func readFrameHeader(r io.Reader, max uint32) (typ byte, n uint32, err error) {
	var hdr [frameHeaderLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, 0, err
	}
	size := binary.BigEndian.Uint32(hdr[:4])
	if size == 0 || size > max {
		return 0, 0, fmt.Errorf("frame length %d: %w", size, ErrFrame)
	}
	typ = hdr[4]
	if !knownFrame(typ) {
		return 0, 0, fmt.Errorf("frame type %d: %w", typ, ErrFrame)
	}
	return typ, size - 1, nil
}

// readFrame reads one frame of at most max bytes into buf (grown as needed)
// and returns its type and payload. Errors as for readFrameHeader, and
// io.ErrUnexpectedEOF for a payload cut short.
func readFrame(r io.Reader, buf []byte, max uint32) (typ byte, payload []byte, err error) {
	typ, n, err := readFrameHeader(r, max)
	if err != nil {
		return 0, nil, err
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	payload = buf[:n]
	if _, err := io.ReadFull(r, payload); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return typ, payload, nil
}

func marshal(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
