package transfer

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"syscall"
)

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
}

// challenge answers hello (server -> client) and proves the server knows the
// secret.
type challenge struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	HostID  string `json:"host_id"`
	Nonce   []byte `json:"nonce"`
	Proof   []byte `json:"proof"`
	// Instance and Imports: as in hello.
	Instance string   `json:"instance"`
	Imports  []string `json:"imports,omitempty"`
}

// authMsg proves the client knows the secret (client -> server).
type authMsg struct {
	Proof []byte `json:"proof"`
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

// Meta describes one tensor of a transfer.
type Meta struct {
	// Rel is the tensor's path relative to the transfer's root: "" when the
	// root is the tensor itself, else "a/b" under the root directory.
	Rel string `json:"rel"`
	// DType is the canonical dtype ("F32"); Shape is comma-separated dims.
	DType string `json:"dtype"`
	Shape string `json:"shape"`
	// NBytes is the tensor's size in bytes.
	NBytes int64 `json:"nbytes"`
}

// request is what a client asks (client -> server).
type request struct {
	// Op is "put" (the client sends tensors to Path) or "get" (the server
	// sends the tensors at Path).
	Op   string `json:"op"`
	Path string `json:"path"`
	// Dir says the put's source is a directory tree (Path names a directory).
	Dir     bool   `json:"dir,omitempty"`
	Tensors []Meta `json:"tensors,omitempty"`
	// IPC, on a put between daemons of one host, gives the exported memory
	// of each tensor: the server copies from it and no bytes cross the
	// socket. On a get, IPCOK asks the server for the same.
	IPC   []IPCDesc `json:"ipc,omitempty"`
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

// idsMsg carries export ids on a lease channel: frameRevoke (exporter ->
// importer: drop these) and frameRevoked (importer -> exporter: dropped,
// whether asked or on its own).
type idsMsg struct {
	IDs []uint64 `json:"ids"`
}

// progressMsg is the optional payload of a frameKeepalive from the
// receiving node of an IPC put: the bytes it has copied so far.
type progressMsg struct {
	BytesDone int64 `json:"bytes_done"`
}

// reply is a frameOK payload.
type reply struct {
	Dir     bool      `json:"dir,omitempty"`
	Tensors []Meta    `json:"tensors,omitempty"`
	Copied  int       `json:"copied,omitempty"`
	IPC     []IPCDesc `json:"ipc,omitempty"`
	// Streams, Token and Chunk answer a request's Streams: how many streams
	// the data takes (0 or 1: only this connection, chunks in order), the
	// token for the others to join with, and, on a get, the sender's chunk
	// size.
	Streams int    `json:"streams,omitempty"`
	Token   []byte `json:"token,omitempty"`
	Chunk   int    `json:"chunk,omitempty"`
}

// doneMsg ends a data stream.
type doneMsg struct {
	Chunks int64 `json:"chunks"`
}

// wireError is a frameError payload: an errno name and a message.
type wireError struct {
	Errno   string `json:"errno"`
	Message string `json:"message"`
	Copied  int    `json:"copied,omitempty"`
}

// Error is a failure reported by, or about, a peer. Errno is what the
// filesystem returns for it; Copied counts tensors already in place when a
// directory copy failed part-way.
type Error struct {
	Errno  syscall.Errno
	Msg    string
	Copied int
	// broken: the connection itself failed (nothing more can be said on it).
	broken bool
}

func (e *Error) Error() string {
	if e.Copied > 0 {
		return fmt.Sprintf("%s (%d tensors copied before the failure)", e.Msg, e.Copied)
	}
	return e.Msg
}

// Unwrap lets errors.Is(err, syscall.ENOENT) and the like match.
func (e *Error) Unwrap() error { return e.Errno }

// errnoNames are the errnos that cross the wire by name.
var errnoNames = map[string]syscall.Errno{
	"ENOENT": syscall.ENOENT, "EINVAL": syscall.EINVAL, "EACCES": syscall.EACCES,
	"EIO": syscall.EIO, "EISDIR": syscall.EISDIR, "ENOTDIR": syscall.ENOTDIR,
	"ENOSPC": syscall.ENOSPC, "EFBIG": syscall.EFBIG, "EEXIST": syscall.EEXIST,
	"EPROTO": syscall.EPROTO, "ETIMEDOUT": syscall.ETIMEDOUT, "EBUSY": syscall.EBUSY,
	"EPERM": syscall.EPERM, "ENAMETOOLONG": syscall.ENAMETOOLONG, "ESTALE": syscall.ESTALE,
	"ENOTEMPTY": syscall.ENOTEMPTY, "ECONNREFUSED": syscall.ECONNREFUSED,
	"EXDEV": syscall.EXDEV, "EHOSTUNREACH": syscall.EHOSTUNREACH,
}

func errnoName(e syscall.Errno) string {
	for n, v := range errnoNames {
		if v == e {
			return n
		}
	}
	return "EIO"
}

// Errno extracts the errno an error should surface as: the one it wraps, or
// EIO.
func Errno(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) && e != 0 {
		return e
	}
	return syscall.EIO
}

func marshal(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
