// Package safetensors reads and writes the header of the safetensors file
// format (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length N, N bytes of JSON describing every tensor, then the raw tensor
// bytes. It knows nothing of FUSE or of tensorfs's daemon: the CLI's import and
// export commands use it as clients of a mounted filesystem, and it is
// unit-tested and fuzzed on its own.
//
// The header JSON is an object whose keys are tensor names, each mapping to
//
//	{"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
//
// with begin and end byte offsets relative to the end of the header, plus an
// optional "__metadata__" object of string values.
package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tensorfs/tensorfs/dtype"
)

// MaxHeaderSize is the largest header (the JSON, after the 8-byte length) that
// ReadHeader accepts and Encode produces, in bytes: 100 MiB. The reference
// implementation caps it at 100,000,000 bytes for the same reason: the length
// comes from the file, and an untrusted file must not make a reader allocate
// without bound.
const MaxHeaderSize = 100 << 20

// MetadataKey is the header key that holds free-form string metadata rather
// than a tensor.
const MetadataKey = "__metadata__"

// ErrFormat is wrapped by every error that says a file or header is not valid
// safetensors (as opposed to an I/O error from the reader), so callers can tell
// a bad file from a failing disk with errors.Is.
var ErrFormat = errors.New("invalid safetensors file")

// Tensor is one entry of a header.
type Tensor struct {
	// Name is the header key: any valid UTF-8 string but MetadataKey. The
	// format gives '/' no meaning; importers may.
	Name  string
	DType dtype.DType // canonical safetensors name, e.g. "F32", "BF16"
	Shape dtype.Shape // outermost first; empty for a scalar
	// Begin and End are byte offsets of the tensor's data relative to the
	// start of the data region (Header.DataOffset in the file);
	// End-Begin is exactly dtype.NBytes(DType, Shape).
	Begin, End int64
}

// Size is the tensor's data size in bytes.
func (t Tensor) Size() int64 { return t.End - t.Begin }

// Header is a parsed or planned safetensors header.
type Header struct {
	// Tensors are sorted by Name (byte order); names are unique.
	Tensors []Tensor
	// Metadata is the "__metadata__" object: nil when the header has none
	// (or has it as null), possibly empty when the header has "{}".
	Metadata map[string]string
	// DataOffset is the file offset of the data region in bytes: 8 plus the
	// header length.
	DataOffset int64
}

// asFormat wraps a description of what is wrong with a file in ErrFormat. The
// exported functions do it once, at the top, so that nested context reads
// left to right ("invalid safetensors file: tensor "w": shape ...").
func asFormat(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrFormat, err)
}

// ReadHeader reads and validates the header of a safetensors file of size
// bytes read through r. It is strict, as a file may come from anywhere: the
// header length must be at most MaxHeaderSize and inside the file; the JSON
// must be valid UTF-8 holding one object with no duplicate keys and nothing
// after it but whitespace; every tensor must have exactly the fields dtype (a
// canonical safetensors name known to package tensor), shape (non-negative
// integers) and data_offsets ([begin, end] with end-begin equal to the bytes
// the dtype and shape need), lie inside the file and overlap no other tensor
// (zero-byte tensors overlap nothing); __metadata__, when present, must map
// strings to strings. Unlike the reference reader it tolerates gaps between
// tensors and bytes after the last one, which harm nothing.
//
// Errors: ones wrapping ErrFormat that name the offending tensor and field, or
// the reader's own error.
func ReadHeader(r io.ReaderAt, size int64) (*Header, error) {
	if size < 8 {
		return nil, asFormat(fmt.Errorf("file is %d bytes, shorter than the 8-byte header length", size))
	}
	var lenBuf [8]byte
	if err := readFull(r, lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("reading the header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	switch {
	case n > MaxHeaderSize:
		return nil, asFormat(fmt.Errorf("header length %d is over the %d-byte limit", n, MaxHeaderSize))
	case n > uint64(size-8):
		return nil, asFormat(fmt.Errorf("header length %d runs past the end of the %d-byte file (truncated?)", n, size))
	case n < 2:
		return nil, asFormat(fmt.Errorf("header length %d is too short for a JSON object", n))
	}
	buf := make([]byte, n)
	if err := readFull(r, buf, 8); err != nil {
		return nil, fmt.Errorf("reading the %d-byte header: %w", n, err)
	}
	h, err := parseHeader(buf, 8+int64(n), size)
	return h, asFormat(err)
}

// readFull reads len(p) bytes at off; a short read is a truncated file.
func readFull(r io.ReaderAt, p []byte, off int64) error {
	k, err := r.ReadAt(p, off)
	if k == len(p) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		return asFormat(fmt.Errorf("file ends after %d of %d bytes at offset %d (truncated?)", k, len(p), off))
	}
	return err
}

// parseHeader validates the JSON header js of a file of fileSize bytes whose
// data region starts at dataOffset.
func parseHeader(js []byte, dataOffset, fileSize int64) (*Header, error) {
	if !utf8.Valid(js) {
		return nil, fmt.Errorf("header is not valid UTF-8")
	}
	h := &Header{DataOffset: dataOffset}
	dataSize := fileSize - dataOffset
	seen := map[string]bool{}
	err := eachField(js, func(key string, val json.RawMessage) error {
		if key == MetadataKey {
			md, err := parseMetadata(val)
			h.Metadata = md
			return err
		}
		t, err := parseTensor(key, val)
		if err != nil {
			return err
		}
		if t.End > dataSize {
			return fmt.Errorf("tensor %q: data_offsets [%d, %d] run past the %d-byte data region (truncated?)", key, t.Begin, t.End, dataSize)
		}
		h.Tensors = append(h.Tensors, t)
		return nil
	}, seen)
	if err != nil {
		return nil, err
	}
	if err := checkOverlap(h.Tensors); err != nil {
		return nil, err
	}
	sort.Slice(h.Tensors, func(i, j int) bool { return h.Tensors[i].Name < h.Tensors[j].Name })
	return h, nil
}

// eachField calls fn for every key of the JSON object in js, in file order,
// refusing duplicate keys (encoding/json would silently keep the last one, and
// two readers that pick differently must never see different tensors) and
// anything but whitespace after the object. seen records the keys.
func eachField(js []byte, fn func(key string, val json.RawMessage) error, seen map[string]bool) error {
	dec := json.NewDecoder(bytes.NewReader(js))
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("invalid JSON: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("JSON is %s, not an object", describe(tok))
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("invalid JSON: %v", err)
		}
		key, ok := tok.(string)
		if !ok {
			return fmt.Errorf("invalid JSON: key %v is not a string", tok)
		}
		if seen[key] {
			return fmt.Errorf("key %q appears twice", key)
		}
		seen[key] = true
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return fmt.Errorf("invalid JSON in the value of %q: %v", key, err)
		}
		if err := fn(key, val); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil {
		return fmt.Errorf("invalid JSON: %v", err)
	}
	if tok, err := dec.Token(); err != io.EOF {
		if err != nil {
			return fmt.Errorf("invalid JSON after the header object: %v", err)
		}
		return fmt.Errorf("unexpected %s after the header object", describe(tok))
	}
	return nil
}

// describe names a JSON token's kind for error messages.
func describe(tok json.Token) string {
	switch v := tok.(type) {
	case json.Delim:
		if v == '[' {
			return "an array"
		}
		return fmt.Sprintf("%q", string(v))
	case string:
		return "a string"
	case float64, json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", tok)
}

// parseMetadata decodes the __metadata__ value: an object of strings, or null.
func parseMetadata(val json.RawMessage) (map[string]string, error) {
	if string(val) == "null" {
		return nil, nil
	}
	md := map[string]string{}
	err := eachField(val, func(k string, v json.RawMessage) error {
		var s string
		if len(v) == 0 || v[0] != '"' || json.Unmarshal(v, &s) != nil {
			return fmt.Errorf("value of %q is not a string", k)
		}
		md[k] = s
		return nil
	}, map[string]bool{})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", MetadataKey, err)
	}
	return md, nil
}

// parseTensor decodes and checks one tensor entry, except for its place in
// the file.
func parseTensor(name string, val json.RawMessage) (Tensor, error) {
	t := Tensor{Name: name}
	var dtypeRaw, shapeRaw, offRaw json.RawMessage
	err := eachField(val, func(k string, v json.RawMessage) error {
		switch k {
		case "dtype":
			dtypeRaw = v
		case "shape":
			shapeRaw = v
		case "data_offsets":
			offRaw = v
		default:
			return fmt.Errorf("unknown field %q (a tensor has dtype, shape and data_offsets)", k)
		}
		return nil
	}, map[string]bool{})
	if err != nil {
		return t, fmt.Errorf("tensor %q: %w", name, err)
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
	}{{"dtype", dtypeRaw}, {"shape", shapeRaw}, {"data_offsets", offRaw}} {
		if f.raw == nil {
			return t, fmt.Errorf("tensor %q: no %s", name, f.name)
		}
	}
	var ds string
	if dtypeRaw[0] != '"' || json.Unmarshal(dtypeRaw, &ds) != nil {
		return t, fmt.Errorf("tensor %q: dtype %s is not a string", name, dtypeRaw)
	}
	// The format names dtypes canonically; ParseDType's torch/numpy spellings
	// are for people typing xattrs, not for files.
	d, err := dtype.Parse(ds)
	if err != nil || string(d) != ds {
		return t, fmt.Errorf("tensor %q: unknown dtype %q (want a safetensors name like F32, BF16, I64)", name, ds)
	}
	t.DType = d
	dims, err := uints(shapeRaw, dtype.MaxSize)
	if err != nil {
		return t, fmt.Errorf("tensor %q: shape %s: %v", name, shapeRaw, err)
	}
	t.Shape = dtype.Shape(dims)
	offs, err := uints(offRaw, math.MaxInt64)
	if err != nil || len(offs) != 2 {
		if err == nil {
			err = fmt.Errorf("want [begin, end]")
		}
		return t, fmt.Errorf("tensor %q: data_offsets %s: %v", name, offRaw, err)
	}
	t.Begin, t.End = offs[0], offs[1]
	if t.End < t.Begin {
		return t, fmt.Errorf("tensor %q: data_offsets [%d, %d] end before they begin", name, t.Begin, t.End)
	}
	nb, err := dtype.NBytes(t.DType, t.Shape)
	if err != nil {
		return t, fmt.Errorf("tensor %q: %v", name, err)
	}
	if nb != t.Size() {
		return t, fmt.Errorf("tensor %q: data_offsets [%d, %d] hold %d bytes, but %s %s needs %d", name, t.Begin, t.End, t.Size(), t.DType, shapeString(t.Shape), nb)
	}
	return t, nil
}

// uints decodes a JSON array of integers in [0, limit]. JSON numbers with a
// sign, fraction or exponent are refused, as the reference's usize fields do.
func uints(raw json.RawMessage, limit uint64) ([]int64, error) {
	if len(raw) == 0 || raw[0] != '[' {
		return nil, fmt.Errorf("not an array")
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, err
	}
	out := make([]int64, len(elems))
	for i, e := range elems {
		v, err := strconv.ParseUint(string(e), 10, 64)
		if err != nil || v > limit {
			return nil, fmt.Errorf("element %s is not an integer in [0, %d]", e, limit)
		}
		out[i] = int64(v)
	}
	return out, nil
}

// checkOverlap refuses tensors whose byte ranges overlap.
func checkOverlap(ts []Tensor) error {
	byPos := make([]Tensor, 0, len(ts))
	for _, t := range ts {
		if t.Size() > 0 {
			byPos = append(byPos, t)
		}
	}
	sort.Slice(byPos, func(i, j int) bool { return byPos[i].Begin < byPos[j].Begin })
	for i := 1; i < len(byPos); i++ {
		a, b := byPos[i-1], byPos[i]
		if b.Begin < a.End {
			return fmt.Errorf("tensors %q [%d, %d] and %q [%d, %d] overlap", a.Name, a.Begin, a.End, b.Name, b.Begin, b.End)
		}
	}
	return nil
}

// shapeString writes a shape as the header does: "[2,3]".
func shapeString(s dtype.Shape) string { return "[" + s.String() + "]" }

// NewHeader plans the header of a new file: the tensors (whose Begin and End
// are ignored) sorted by name and laid out contiguously from offset 0, and the
// metadata (written only when non-empty). DataOffset is set from the encoded
// size, so the data of Tensors[i] goes at file offset DataOffset+Begin.
//
// Errors, all wrapping ErrFormat: a name that is equal to MetadataKey or
// duplicated; an unknown dtype or a shape that does not make whole bytes or is
// too large (tensor.NBytes's errors); data totalling more than an int64; and
// Encode's errors.
func NewHeader(ts []Tensor, metadata map[string]string) (*Header, error) {
	h, err := newHeader(ts, metadata)
	return h, asFormat(err)
}

func newHeader(ts []Tensor, metadata map[string]string) (*Header, error) {
	h := &Header{Tensors: slices.Clone(ts)}
	if metadata != nil {
		h.Metadata = maps.Clone(metadata)
	}
	sort.Slice(h.Tensors, func(i, j int) bool { return h.Tensors[i].Name < h.Tensors[j].Name })
	var off int64
	for i := range h.Tensors {
		t := &h.Tensors[i]
		switch {
		case t.Name == MetadataKey:
			return nil, fmt.Errorf("tensor name %q is reserved for metadata", t.Name)
		case i > 0 && t.Name == h.Tensors[i-1].Name:
			return nil, fmt.Errorf("tensor name %q appears twice", t.Name)
		}
		nb, err := dtype.NBytes(t.DType, t.Shape)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %v", t.Name, err)
		}
		if off > math.MaxInt64-MaxHeaderSize-8-nb {
			return nil, fmt.Errorf("tensors total more than %d bytes", int64(math.MaxInt64))
		}
		t.Begin, t.End = off, off+nb
		off += nb
	}
	enc, err := h.encode()
	if err != nil {
		return nil, err
	}
	h.DataOffset = int64(len(enc))
	return h, nil
}

// Encode returns the first DataOffset bytes of the file: the 8-byte
// little-endian length, then compact JSON with __metadata__ first (when
// non-empty) and the tensors in the order of their offsets, padded with spaces
// to a multiple of 8 bytes as the reference writer does (so the data region is
// 8-byte aligned). Errors wrapping ErrFormat: a header over MaxHeaderSize; a
// name or metadata string that is not valid UTF-8 (JSON cannot carry it).
// DataOffset is left alone: it matches len of the result for a header from
// NewHeader, not necessarily for one read from a file.
func (h *Header) Encode() ([]byte, error) {
	b, err := h.encode()
	return b, asFormat(err)
}

func (h *Header) encode() ([]byte, error) {
	var b bytes.Buffer
	b.Write(make([]byte, 8))
	b.WriteByte('{')
	first := true
	sep := func() {
		if !first {
			b.WriteByte(',')
		}
		first = false
	}
	if len(h.Metadata) > 0 {
		sep()
		writeString(&b, MetadataKey)
		b.WriteString(":{")
		keys := make([]string, 0, len(h.Metadata))
		for k := range h.Metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for i, k := range keys {
			if v := h.Metadata[k]; !utf8.ValidString(k) || !utf8.ValidString(v) {
				return nil, fmt.Errorf("%s entry %q is not valid UTF-8", MetadataKey, k)
			}
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(&b, k)
			b.WriteByte(':')
			writeString(&b, h.Metadata[k])
		}
		b.WriteByte('}')
	}
	order := slices.Clone(h.Tensors)
	sort.SliceStable(order, func(i, j int) bool {
		if order[i].Begin != order[j].Begin {
			return order[i].Begin < order[j].Begin
		}
		return order[i].End < order[j].End
	})
	for _, t := range order {
		if !utf8.ValidString(t.Name) {
			return nil, fmt.Errorf("tensor name %q is not valid UTF-8", t.Name)
		}
		sep()
		writeString(&b, t.Name)
		b.WriteString(`:{"dtype":`)
		writeString(&b, string(t.DType))
		b.WriteString(`,"shape":[`)
		for i, d := range t.Shape {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatInt(d, 10))
		}
		fmt.Fprintf(&b, `],"data_offsets":[%d,%d]}`, t.Begin, t.End)
	}
	b.WriteByte('}')
	if pad := (8 - b.Len()%8) % 8; pad > 0 {
		b.WriteString(strings.Repeat(" ", pad))
	}
	out := b.Bytes()
	n := len(out) - 8
	if n > MaxHeaderSize {
		return nil, fmt.Errorf("header of %d bytes is over the %d-byte limit", n, MaxHeaderSize)
	}
	binary.LittleEndian.PutUint64(out, uint64(n))
	return out, nil
}

// writeString writes s as a JSON string. HTML escaping is off so that names
// like "a<b" read the same in the file as in the reference writer's output.
func writeString(b *bytes.Buffer, s string) {
	var tmp bytes.Buffer
	enc := json.NewEncoder(&tmp)
	enc.SetEscapeHTML(false)
	// Encoding a string cannot fail.
	_ = enc.Encode(s)
	b.Write(bytes.TrimSuffix(tmp.Bytes(), []byte("\n")))
}
