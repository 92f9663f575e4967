package transfer

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"syscall"
)

// A transfer's descriptor list (its Meta and IPCDesc entries) travels after
// its request's or reply's JSON as one binary table (encodeMsg), not as JSON
// arrays: decoding JSON
// cost about 6 µs per descriptor (1000-descriptor calls spent half the
// receiver's CPU in encoding/json), the table a few tens of nanoseconds. Its
// layout, little-endian:
//
//	u32 nstrings, then each string: u32 length, bytes (Rel, DType, Shape
//	    and handle strings, each once however many descriptors name it)
//	u32 nmeta, then each Meta: u32 rel, u32 dtype, u32 shape (string
//	    indices), i64 nbytes, i64 off, u8 flags (1 in place, 2 exact,
//	    4 spans); with flag 4, u32 nspans, then each Span: i64 src,
//	    i64 dst, i64 n (its Pos is the sum of the n before it)
//	u32 nipc (0 or nmeta), then each IPCDesc: u32 handle (a string index),
//	    i64 offset, u64 alloc, u64 export, u64 generation, u8 flags (1 leased)
const (
	tableMetaLen = 3*4 + 8 + 8 + 1
	tableSpanLen = 3 * 8
	tableIPCLen  = 4 + 8 + 8 + 8 + 8 + 1
)

// appendTable appends the binary table of metas and descs to b (grown
// once, to the table's size).
func appendTable(b []byte, metas []Meta, descs []IPCDesc) []byte {
	index := map[string]uint32{}
	var strs []string
	intern := func(s string) uint32 {
		i, ok := index[s]
		if !ok {
			i = uint32(len(strs))
			index[s] = i
			strs = append(strs, s)
		}
		return i
	}
	type metaRef struct{ rel, dt, sh uint32 }
	refs := make([]metaRef, len(metas))
	for i, m := range metas {
		refs[i] = metaRef{intern(m.Rel), intern(m.DType), intern(m.Shape)}
	}
	handles := make([]uint32, len(descs))
	for i, d := range descs {
		handles[i] = intern(d.Handle)
	}
	n := 12 + len(metas)*tableMetaLen + len(descs)*tableIPCLen
	for _, m := range metas {
		if m.Spans != nil {
			n += 4 + len(m.Spans)*tableSpanLen
		}
	}
	for _, s := range strs {
		n += 4 + len(s)
	}
	b = slices.Grow(b, n)
	le := binary.LittleEndian
	b = le.AppendUint32(b, uint32(len(strs)))
	for _, s := range strs {
		b = le.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	b = le.AppendUint32(b, uint32(len(metas)))
	for i, m := range metas {
		b = le.AppendUint32(b, refs[i].rel)
		b = le.AppendUint32(b, refs[i].dt)
		b = le.AppendUint32(b, refs[i].sh)
		b = le.AppendUint64(b, uint64(m.NBytes))
		b = le.AppendUint64(b, uint64(m.Off))
		var fl byte
		if m.InPlace {
			fl |= 1
		}
		if m.Exact {
			fl |= 2
		}
		if m.Spans != nil {
			fl |= 4
		}
		if m.Line {
			fl |= 8
		}
		b = append(b, fl)
		if m.Spans != nil {
			b = le.AppendUint32(b, uint32(len(m.Spans)))
			// In place into the room grown above: a thousand spans are
			// the bulk of a KV-cache call's table.
			at := len(b)
			b = b[:at+len(m.Spans)*tableSpanLen]
			for k, sp := range m.Spans {
				e := b[at+k*tableSpanLen : at+(k+1)*tableSpanLen]
				le.PutUint64(e, uint64(sp.Src))
				le.PutUint64(e[8:], uint64(sp.Dst))
				le.PutUint64(e[16:], uint64(sp.N))
			}
		}
	}
	b = le.AppendUint32(b, uint32(len(descs)))
	for i, d := range descs {
		b = le.AppendUint32(b, handles[i])
		b = le.AppendUint64(b, uint64(d.Offset))
		b = le.AppendUint64(b, d.Alloc)
		b = le.AppendUint64(b, d.Export)
		b = le.AppendUint64(b, d.Generation)
		var fl byte
		if d.Leased {
			fl |= 1
		}
		b = append(b, fl)
	}
	return b
}

// tableReader reads a table, remembering the first overrun.
type tableReader struct {
	p   []byte
	bad bool
	// room, when not nil, is where the span lists go (spans): cut one
	// after the other from its spare capacity, which is made enough for
	// the rest of the table's when a list does not fit.
	room *[]Span
}

func (r *tableReader) take(n int) []byte {
	if r.bad || n < 0 || n > len(r.p) {
		r.bad = true
		return nil
	}
	b := r.p[:n]
	r.p = r.p[n:]
	return b
}

func (r *tableReader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *tableReader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (r *tableReader) u8() byte {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

// count reads a count of entries of at least size bytes each, refusing
// one the rest of the table cannot hold (so a peer cannot make us
// allocate more than it sent).
func (r *tableReader) count(size int) int {
	n := r.u32()
	if int64(n)*int64(size) > int64(len(r.p)) {
		r.bad = true
		return 0
	}
	return int(n)
}

// spans reads a span list, its positions laid end to end; a value past
// int64 marks the table bad (checkSpans checks the rest). The list is read
// in one block from a local slice: a field at a time through take cost a
// GC write barrier per field (20 ns a span).
func (r *tableReader) spans() []Span {
	n := r.count(tableSpanLen)
	p := r.take(n * tableSpanLen)
	var spans []Span
	if r.room == nil || n == 0 {
		spans = make([]Span, n) // not nil: a list, if an empty one
	} else {
		b := *r.room
		if n > cap(b)-len(b) {
			// The lists cut before stay where they are.
			b = make([]Span, 0, n+len(r.p)/tableSpanLen)
		}
		k := len(b)
		spans, *r.room = b[k:k+n:k+n], b[:k+n]
	}
	var pos int64
	var high uint64
	le := binary.LittleEndian
	for i := range spans {
		e := p[i*tableSpanLen : (i+1)*tableSpanLen]
		src, dst, k := le.Uint64(e), le.Uint64(e[8:]), le.Uint64(e[16:])
		high |= src | dst | k
		spans[i] = Span{Pos: pos, Src: int64(src), Dst: int64(dst), N: int64(k)}
		pos += int64(k)
	}
	if high > math.MaxInt64 {
		r.bad = true
	}
	return spans
}

// decodeTable parses a table (appendTable). With room not nil, the span
// lists are cut from *room's capacity, replaced by a larger array when
// they do not fit (tableReader.room). Errors: EPROTO
// for a table that is short, has trailing bytes, names a string it lacks,
// or has a size or offset past int64.
func decodeTable(p []byte, room *[]Span) ([]Meta, []IPCDesc, error) {
	r := &tableReader{p: p}
	if room != nil {
		*room = (*room)[:0]
		r.room = room
	}
	strs := make([]string, r.count(4))
	for i := range strs {
		strs[i] = string(r.take(int(r.u32())))
	}
	str := func(i uint32) string {
		if int(i) >= len(strs) {
			r.bad = true
			return ""
		}
		return strs[i]
	}
	metas := make([]Meta, r.count(tableMetaLen))
	for i := range metas {
		m := &metas[i]
		m.Rel, m.DType, m.Shape = str(r.u32()), str(r.u32()), str(r.u32())
		nb, off := r.u64(), r.u64()
		if nb > math.MaxInt64 || off > math.MaxInt64 {
			r.bad = true
		}
		m.NBytes, m.Off = int64(nb), int64(off)
		fl := r.u8()
		m.InPlace, m.Exact, m.Line = fl&1 != 0, fl&2 != 0, fl&8 != 0
		if fl&4 != 0 {
			m.Spans = r.spans()
		}
	}
	var descs []IPCDesc
	if n := r.count(tableIPCLen); n > 0 {
		descs = make([]IPCDesc, n)
		for i := range descs {
			d := &descs[i]
			d.Handle = str(r.u32())
			off := r.u64()
			if off > math.MaxInt64 {
				r.bad = true
			}
			d.Offset = int64(off)
			d.Alloc, d.Export, d.Generation = r.u64(), r.u64(), r.u64()
			d.Leased = r.u8()&1 != 0
		}
	}
	if r.bad || len(r.p) != 0 {
		return nil, nil, &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("malformed descriptor table of %d bytes", len(p))}
	}
	return metas, descs, nil
}

// encodeMsg appends to b the payload of a JSON message: v as JSON, and,
// for a request or reply with descriptors, a NUL (which JSON text never
// holds outside an escape) and their table. The table stays out of the
// JSON so that neither side scans it as text (a base64 field inside the
// JSON still cost the receiver a third of its CPU on 1000-descriptor
// calls). A connection encodes into a buffer it keeps (conn.enc): a
// 1000-descriptor request is 25 KB, allocated and cleared per call before.
func encodeMsg(b []byte, v any) []byte {
	var metas []Meta
	var descs []IPCDesc
	switch m := v.(type) {
	case request:
		metas, descs, m.Tensors, m.IPC = m.Tensors, m.IPC, nil, nil
		v = m
	case reply:
		metas, descs, m.Tensors, m.IPC = m.Tensors, m.IPC, nil, nil
		v = m
	}
	b = append(b, marshal(v)...)
	if len(metas) > 0 || len(descs) > 0 {
		b = appendTable(append(b, 0), metas, descs)
	}
	return b
}

// decodeMsg parses a payload of encodeMsg into v; a table fills a request's
// or reply's Tensors and IPC. Errors: JSON's, or EPROTO for a malformed
// table or one on another message.
func decodeMsg(p []byte, v any) error { return decodeMsgIn(p, v, nil) }

// decodeMsgIn is decodeMsg with the table's span lists cut from *room
// (decodeTable): a connection's requests reuse one array (serve) where a
// 1000-descriptor put's 32 KB of spans were allocated, cleared, per call.
func decodeMsgIn(p []byte, v any, room *[]Span) error {
	js, tab, hasTable := bytes.Cut(p, []byte{0})
	if err := json.Unmarshal(js, v); err != nil {
		return err
	}
	if !hasTable {
		return nil
	}
	metas, descs, err := decodeTable(tab, room)
	if err != nil {
		return err
	}
	switch m := v.(type) {
	case *request:
		m.Tensors, m.IPC = metas, descs
	case *reply:
		m.Tensors, m.IPC = metas, descs
	default:
		return &Error{Errno: syscall.EPROTO, Msg: "a descriptor table on a message that takes none"}
	}
	return nil
}
