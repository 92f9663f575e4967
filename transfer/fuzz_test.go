package transfer

import (
	"bytes"
	"errors"
	"io"
	"math"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// frameBytes encodes one frame as writeFrame does.
func frameBytes(typ byte, payload []byte) []byte {
	var b bytes.Buffer
	if err := writeFrame(&b, typ, payload); err != nil {
		panic(err)
	}
	return b.Bytes()
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func frameSeeds() [][]byte {
	data := []byte("0123456789abcdef")
	return [][]byte{
		{},
		{0, 0, 0},
		{0, 0, 0, 0, frameHello},
		{0, 0, 0, 1, 0},
		{0, 0, 0, 1, 9},
		{0, 0, 0, 1, frameOK},
		{0, 0x40, 0x10, 0x01, frameData}, // MaxFrame+1
		{0, 0x40, 0x10, 0x00, frameData}, // MaxFrame, no payload
		{0xff, 0xff, 0xff, 0xff, frameData},
		frameBytes(frameHello, marshal(hello{Version: ProtocolVersion, Name: "a", Nonce: make([]byte, 32)})),
		frameBytes(frameData, dataFrame(0, 0, data, crcOf(data))),
		frameBytes(frameData, dataFrame(0, -1, data, 0)),
		frameBytes(frameData, dataFrame(math.MaxUint32, math.MaxInt64, nil, 0)),
		frameBytes(frameData, []byte{1, 2, 3}),
		cat(frameBytes(frameRequest, encodeMsg(nil, request{Op: "get", Path: "/t"})), frameBytes(frameDone, marshal(doneMsg{}))),
		frameBytes(frameData, dataFrame(0, 0, data, crcOf(data)))[:20],
		frameBytes(frameRevoke, marshal(idsMsg{IDs: []uint64{1, math.MaxUint64}})),
		frameBytes(frameRevoked, marshal(idsMsg{})),
		frameBytes(frameKeepalive, nil),
	}
}

// FuzzReadFrame: readFrame and parseChunk on arbitrary bytes never panic,
// never allocate more than MaxFrame for one frame, accept only what
// writeFrame/putChunkHeader produce, and fail only with ErrFrame or an EOF.
func FuzzReadFrame(f *testing.F) {
	for _, s := range frameSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		var buf []byte
		var ms runtime.MemStats
		for {
			before := len(in) - r.Len()
			runtime.ReadMemStats(&ms)
			alloc0 := ms.TotalAlloc
			typ, p, err := readFrame(r, buf, MaxFrame)
			runtime.ReadMemStats(&ms)
			if d := ms.TotalAlloc - alloc0; d > MaxFrame+64<<10 {
				t.Fatalf("readFrame allocated %d bytes (MaxFrame %d)", d, MaxFrame)
			}
			if err != nil {
				switch {
				case errors.Is(err, ErrFrame):
					if len(in)-before < 5 {
						t.Fatalf("ErrFrame before a whole header: %v", err)
					}
					n := uint32(in[before])<<24 | uint32(in[before+1])<<16 | uint32(in[before+2])<<8 | uint32(in[before+3])
					tp := in[before+4]
					if n != 0 && n <= MaxFrame && tp >= frameHello && tp <= frameDone {
						t.Fatalf("ErrFrame for a valid header (len %d type %d): %v", n, tp, err)
					}
				case err == io.EOF:
					if before != len(in) {
						t.Fatalf("io.EOF with %d bytes left", len(in)-before)
					}
				case err == io.ErrUnexpectedEOF:
				default:
					t.Fatalf("unexpected error %T %v", err, err)
				}
				return
			}
			if len(p)+1 > MaxFrame || cap(p) > MaxFrame {
				t.Fatalf("payload of len %d cap %d", len(p), cap(p))
			}
			if typ < frameHello || typ > frameRevoked {
				t.Fatalf("type %d accepted", typ)
			}
			consumed := len(in) - r.Len() - before
			if consumed != 5+len(p) {
				t.Fatalf("consumed %d bytes for a payload of %d", consumed, len(p))
			}
			if re := frameBytes(typ, p); !bytes.Equal(re, in[before:before+consumed]) {
				t.Fatalf("frame does not round-trip")
			}
			if typ == frameData {
				h, data, err := parseChunk(p)
				if err != nil {
					if !errors.Is(err, ErrFrame) {
						t.Fatalf("parseChunk: %T %v", err, err)
					}
				} else {
					if h.offset < 0 || len(data) != len(p)-dataHeaderLen {
						t.Fatalf("chunk %+v with %d bytes from %d", h, len(data), len(p))
					}
					var hb [dataHeaderLen]byte
					putChunkHeader(hb[:], h)
					if !bytes.Equal(hb[:], p[:dataHeaderLen]) {
						t.Fatalf("chunk header does not round-trip")
					}
				}
			}
			buf = p[:0]
		}
	})
}

// serveSeeds are client byte streams: some for right after the handshake,
// some for a fresh connection.
func serveSeeds() (authed, raw [][]byte) {
	data := []byte("newbytes")
	m := Meta{DType: "U8", Shape: "8", NBytes: 8}
	put := frameBytes(frameRequest, encodeMsg(nil, request{Op: "put", Path: "/t", Tensors: []Meta{m}}))
	dirPut := frameBytes(frameRequest, encodeMsg(nil, request{Op: "put", Path: "/d", Dir: true, Tensors: []Meta{{Rel: "a/b", NBytes: 8}, {Rel: "c", NBytes: 0}}}))
	chunk := frameBytes(frameData, dataFrame(0, 0, data, crcOf(data)))
	done := frameBytes(frameDone, marshal(doneMsg{Chunks: 1}))
	lease := frameBytes(frameRequest, encodeMsg(nil, request{Op: "lease", Path: "/"}))
	manyIDs := make([]uint64, 10000)
	for i := range manyIDs {
		manyIDs[i] = uint64(i) * 7919
	}
	authed = [][]byte{
		{},
		cat(put, chunk, done),
		cat(put, chunk, done, put, chunk, done),
		cat(put, frameBytes(frameData, dataFrame(0, 0, data, 1)), done),
		cat(put, frameBytes(frameData, dataFrame(0, math.MaxInt64, data[:1], crcOf(data[:1]))), done),
		cat(put, frameBytes(frameData, dataFrame(1, 0, data, crcOf(data))), done),
		cat(put, frameBytes(frameError, marshal(wireError{Errno: "EIO", Message: "x"}))),
		cat(dirPut, chunk, done),
		frameBytes(frameRequest, encodeMsg(nil, request{Op: "get", Path: "/t"})),
		frameBytes(frameRequest, encodeMsg(nil, request{Op: "get", Path: "/"})),
		cat(frameBytes(frameRequest, encodeMsg(nil, request{Op: "get", Path: "/nope"})), frameBytes(frameRequest, encodeMsg(nil, request{Op: "get", Path: "/t"}))),
		frameBytes(frameRequest, encodeMsg(nil, request{Op: "rm", Path: "/t"})),
		// several streams: a put that waits for a join, and joins
		cat(frameBytes(frameRequest, encodeMsg(nil, request{Op: "put", Path: "/big", Tensors: []Meta{{DType: "U8", Shape: "8192", NBytes: 8192}}, Streams: 2, Chunk: 1024})),
			frameBytes(frameData, dataFrame(0, 1024, make([]byte, 1024), crcOf(make([]byte, 1024)))), done),
		frameBytes(frameRequest, encodeMsg(nil, request{Op: "join", Path: "/", Token: []byte("nope")})),
		frameBytes(frameRequest, encodeMsg(nil, request{Op: "get", Path: "/t", Streams: 8})),
		frameBytes(frameRequest, []byte("{not json")),
		frameBytes(frameRequest, encodeMsg(nil, request{Op: "put", Path: "/t", Tensors: []Meta{{NBytes: 1 << 40}}})),
		// Lease channels: a hostile peer's revocations, answers for ids it
		// never held, garbage, a huge id list, frames of other kinds.
		cat(lease, frameBytes(frameRevoke, marshal(idsMsg{IDs: []uint64{1, 2, 3}}))),
		cat(lease, frameBytes(frameRevoked, marshal(idsMsg{IDs: []uint64{0, math.MaxUint64}}))),
		cat(lease, frameBytes(frameRevoke, marshal(idsMsg{IDs: manyIDs})), frameBytes(frameRevoked, marshal(idsMsg{IDs: manyIDs}))),
		cat(lease, frameBytes(frameRevoke, []byte("{not json"))),
		cat(lease, frameBytes(frameRevoked, []byte(`{"ids":[-1]}`))),
		cat(lease, frameBytes(frameKeepalive, nil), frameBytes(frameRevoke, marshal(idsMsg{}))),
		cat(lease, put, chunk, done),
		cat(lease, lease),
		chunk,
		{0, 0, 0, 0, 0},
		{0xff, 0xff, 0xff, 0xff, frameRequest},
		[]byte("GET / HTTP/1.1\r\n\r\n"),
	}
	raw = [][]byte{
		{},
		frameBytes(frameHello, marshal(hello{Version: ProtocolVersion, Name: "a", Nonce: make([]byte, 32)})),
		frameBytes(frameHello, marshal(hello{Version: 99, Name: "a"})),
		cat(frameBytes(frameHello, marshal(hello{Version: ProtocolVersion, Name: "a"})), frameBytes(frameAuth, marshal(authMsg{Proof: make([]byte, 32)}))),
		cat(frameBytes(frameHello, marshal(hello{Version: ProtocolVersion, Name: "a"})), put),
		put,
		[]byte("GET / HTTP/1.1\r\n\r\n"),
		{0, 0x40, 0x10, 0x01, frameHello},
	}
	return authed, raw
}

// hasMalformedFrame says whether the frames of b, read as the server reads
// them, reach one with a bad length or type before b runs out.
func hasMalformedFrame(b []byte) bool {
	r := bytes.NewReader(b)
	for {
		_, _, err := readFrame(r, nil, MaxFrame)
		if err != nil {
			return errors.Is(err, ErrFrame)
		}
	}
}

// FuzzServe feeds arbitrary bytes, as a client, to a real service's
// connection handler (Service.serve) over a loopback TCP connection, after a
// correct handshake or without one. The handler must never panic, must end
// the connection once the client has sent everything and half-closed, must
// drop it at once (without waiting for its timeout) on a malformed frame,
// and must leak nothing in its Local.
func FuzzServe(f *testing.F) {
	authedSeeds, rawSeeds := serveSeeds()
	for _, s := range authedSeeds {
		f.Add(true, s)
	}
	for _, s := range rawSeeds {
		f.Add(false, s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	defer ln.Close()
	f.Fuzz(func(t *testing.T, authenticate bool, in []byte) {
		local := newMemLocal()
		local.maxBytes = 1 << 20
		local.put("/t", []byte("12345678"))
		local.put("/d/x", []byte("x"))
		svc, err := New(Config{Name: "srv", Secret: testSecret, Timeout: 10 * time.Second, ChunkSize: 4}, local)
		if err != nil {
			t.Fatal(err)
		}
		nc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		cli := nc.(*net.TCPConn)
		cli.SetLinger(0) // no TIME_WAIT pile-up over millions of runs
		defer cli.Close()
		srv, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan struct{})
		go func() {
			defer close(served)
			svc.serve(srv)
			srv.Close() // as untrack does
		}()
		wait := func(what string, d time.Duration) {
			select {
			case <-served:
			case <-time.After(d):
				t.Fatal(what)
			}
		}
		c := newConn(cli, 5*time.Second, "srv")
		if authenticate {
			if err := clientHandshake(c, "fuzzer", testSecret); err != nil {
				t.Fatalf("handshake: %v", err)
			}
		}
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			io.Copy(io.Discard, c.r)
		}()
		cli.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, werr := cli.Write(in)
		var ne net.Error
		if errors.As(werr, &ne) && ne.Timeout() {
			t.Fatal("the server stopped reading without closing the connection")
		}
		if hasMalformedFrame(in) {
			// garbage: the server hangs up by itself, well before its 10 s timeout
			wait("the server kept the connection after a malformed frame", 3*time.Second)
		}
		cli.CloseWrite()
		wait("serve did not return after the client half-closed", 5*time.Second)
		cli.SetReadDeadline(time.Now().Add(5 * time.Second))
		<-drained
		cnt := local.counts()
		if cnt.OpenSrcs != 0 || cnt.OpenDests != 0 {
			t.Fatalf("leak after serve: %+v", cnt)
		}
		// Known bugs (see TestChunkOutOfRange, TestDuplicateChunkNotCommitted):
		// TRANSFER_FUZZ_SKIP_KNOWN=1 lets a fuzz run look past them.
		skipKnown := os.Getenv("TRANSFER_FUZZ_SKIP_KNOWN") != ""
		for _, m := range cnt.Misuse {
			if !skipKnown || !strings.HasPrefix(m, "hole:") {
				t.Fatalf("misuse of the Local: %s", m)
			}
		}
		if cnt.BadWrites != 0 && !skipKnown {
			t.Fatalf("a write outside its tensor reached the Local (%d)", cnt.BadWrites)
		}
	})
}
