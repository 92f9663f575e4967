package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tensorfs/tensorfs/dtype"
)

// file builds a safetensors file from raw header JSON and dataLen zero bytes.
func file(js string, dataLen int) []byte {
	b := make([]byte, 8, 8+len(js)+dataLen)
	binary.LittleEndian.PutUint64(b, uint64(len(js)))
	b = append(b, js...)
	return append(b, make([]byte, dataLen)...)
}

func read(b []byte) (*Header, error) {
	return ReadHeader(bytes.NewReader(b), int64(len(b)))
}

// fixtureDir finds the shared safetensors fixtures: ../shared/fixtures/safetensors
// relative to the module root. Empty when absent.
func fixtureDir(t testing.TB) string {
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
	fx := filepath.Join(dir, "..", "shared", "fixtures", "safetensors")
	if _, err := os.Stat(fx); err != nil {
		return ""
	}
	return fx
}

func TestReadHeaderValid(t *testing.T) {
	js := `{"__metadata__":{"format":"pt","a":"b"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},` +
		`"b":{"dtype":"BF16","shape":[3],"data_offsets":[24,30]},"s":{"dtype":"I64","shape":[],"data_offsets":[30,38]},` +
		`"e":{"dtype":"U8","shape":[0,5],"data_offsets":[38,38]}}`
	h, err := read(file(js, 38))
	require.NoError(t, err)
	require.Equal(t, map[string]string{"format": "pt", "a": "b"}, h.Metadata)
	require.Equal(t, int64(8+len(js)), h.DataOffset)
	require.Equal(t, int64(38), dataSize(h))
	require.Equal(t, []Tensor{
		{Name: "b", DType: "BF16", Shape: dtype.Shape{3}, Begin: 24, End: 30},
		{Name: "e", DType: "U8", Shape: dtype.Shape{0, 5}, Begin: 38, End: 38},
		{Name: "s", DType: "I64", Shape: dtype.Shape{}, Begin: 30, End: 38},
		{Name: "w", DType: "F32", Shape: dtype.Shape{2, 3}, Begin: 0, End: 24},
	}, h.Tensors)
}

func TestReadHeaderTolerates(t *testing.T) {
	for name, tc := range map[string]struct {
		js   string
		data int
	}{
		"empty object":        {`{}`, 0},
		"padding spaces":      {`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}      `, 1},
		"whitespace in JSON":  {" { \"a\" : { \"dtype\" : \"U8\" , \"shape\" : [ 2 ] , \"data_offsets\" : [ 0 , 2 ] } } ", 2},
		"gap between tensors": {`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[4,5]}}`, 5},
		"bytes after data":    {`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 100},
		"null metadata":       {`{"__metadata__":null}`, 0},
		"empty name":          {`{"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 1},
		"zero-size inside":    {`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"z":{"dtype":"F32","shape":[0],"data_offsets":[2,2]}}`, 4},
		"sub-byte dtype":      {`{"a":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}}`, 2},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := read(file(tc.js, tc.data))
			require.NoError(t, err)
		})
	}
	h, err := read(file(`{"__metadata__":{}}`, 0))
	require.NoError(t, err)
	require.NotNil(t, h.Metadata, "an empty __metadata__ is present, not absent")
}

func TestReadHeaderRejects(t *testing.T) {
	u8 := func(off string) string { return `{"dtype":"U8","shape":[2],"data_offsets":` + off + `}` }
	cases := []struct {
		name, js string
		data     int
		want     string
	}{
		{"not JSON", `{"a":`, 0, "invalid JSON"},
		{"array", `[1,2]`, 0, "not an object"},
		{"trailing garbage", `{}xx`, 0, "after the header object"},
		{"trailing NULs", "{}\x00\x00", 0, "after the header object"},
		{"second object", `{}{}`, 0, "after the header object"},
		{"invalid UTF-8", "{\"\xff\":1}", 0, "UTF-8"},
		{"duplicate tensor", `{"a":` + u8("[0,2]") + `,"a":` + u8("[2,4]") + `}`, 4, `"a" appears twice`},
		{"duplicate field", `{"a":{"dtype":"U8","dtype":"U8","shape":[2],"data_offsets":[0,2]}}`, 2, `"dtype" appears twice`},
		{"unknown field", `{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":1}}`, 2, `unknown field "x"`},
		{"no dtype", `{"a":{"shape":[2],"data_offsets":[0,2]}}`, 2, "no dtype"},
		{"no shape", `{"a":{"dtype":"U8","data_offsets":[0,2]}}`, 2, "no shape"},
		{"no offsets", `{"a":{"dtype":"U8","shape":[2]}}`, 2, "no data_offsets"},
		{"tensor not object", `{"a":5}`, 0, "not an object"},
		{"unknown dtype", `{"a":{"dtype":"F128","shape":[2],"data_offsets":[0,2]}}`, 2, `unknown dtype "F128"`},
		{"torch dtype", `{"a":{"dtype":"float32","shape":[2],"data_offsets":[0,8]}}`, 8, `unknown dtype "float32"`},
		{"lower-case dtype", `{"a":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}}`, 8, `unknown dtype "f32"`},
		{"dtype number", `{"a":{"dtype":7,"shape":[2],"data_offsets":[0,2]}}`, 2, "not a string"},
		{"negative dim", `{"a":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}}`, 2, "shape"},
		{"fractional dim", `{"a":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}}`, 2, "shape"},
		{"exponent dim", `{"a":{"dtype":"U8","shape":[2e0],"data_offsets":[0,2]}}`, 2, "shape"},
		{"null shape", `{"a":{"dtype":"U8","shape":null,"data_offsets":[0,2]}}`, 2, "not an array"},
		{"huge dim", `{"a":{"dtype":"U8","shape":[99999999999999999999],"data_offsets":[0,2]}}`, 2, "shape"},
		{"elements overflow", `{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,2]}}`, 2, "size past"},
		{"sub-byte not whole", `{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}`, 2, "whole bytes"},
		{"one offset", `{"a":` + u8("[0]") + `}`, 2, "want [begin, end]"},
		{"three offsets", `{"a":` + u8("[0,1,2]") + `}`, 2, "want [begin, end]"},
		{"negative offset", `{"a":` + u8("[-1,1]") + `}`, 2, "data_offsets"},
		{"reversed offsets", `{"a":{"dtype":"U8","shape":[0],"data_offsets":[2,0]}}`, 2, "end before they begin"},
		{"size mismatch", `{"a":` + u8("[0,3]") + `}`, 3, "hold 3 bytes, but U8 [2] needs 2"},
		{"past the data", `{"a":` + u8("[0,2]") + `}`, 1, "run past the 1-byte data region"},
		{"huge offsets", `{"a":` + u8("[9223372036854775806,9223372036854775808]") + `}`, 2, "data_offsets"},
		{"overlap", `{"a":` + u8("[0,2]") + `,"b":` + u8("[1,3]") + `}`, 3, "overlap"},
		{"same range", `{"a":` + u8("[0,2]") + `,"b":` + u8("[0,2]") + `}`, 2, "overlap"},
		{"metadata not object", `{"__metadata__":"x"}`, 0, "not an object"},
		{"metadata number", `{"__metadata__":{"k":1}}`, 0, `value of "k" is not a string`},
		{"metadata nested", `{"__metadata__":{"k":{}}}`, 0, `value of "k" is not a string`},
		{"metadata null value", `{"__metadata__":{"k":null}}`, 0, `value of "k" is not a string`},
		{"deep nesting", `{"a":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`, 0, "invalid JSON"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := read(file(tc.js, tc.data))
			require.Error(t, err)
			require.ErrorIs(t, err, ErrFormat)
			require.Contains(t, err.Error(), tc.want)
			require.True(t, strings.HasPrefix(err.Error(), "invalid safetensors file: "), err.Error())
		})
	}
}

func TestReadHeaderLength(t *testing.T) {
	for name, tc := range map[string]struct {
		b    []byte
		want string
	}{
		"empty":         {nil, "shorter than the 8-byte"},
		"seven bytes":   {make([]byte, 7), "shorter than the 8-byte"},
		"zero length":   {make([]byte, 8), "too short"},
		"past the end":  {file("{}", 0)[:9], "runs past the end"},
		"over the cap":  {binary.LittleEndian.AppendUint64(nil, MaxHeaderSize+1), "over the"},
		"max uint64":    {binary.LittleEndian.AppendUint64(nil, ^uint64(0)), "over the"},
		"one byte JSON": {append(binary.LittleEndian.AppendUint64(nil, 1), '{'), "too short"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := read(tc.b)
			require.ErrorIs(t, err, ErrFormat)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// shortReader claims a size larger than what it can read, like a file that
// shrank between stat and read.
type shortReader struct{ b []byte }

func (r shortReader) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(len(r.b)) {
		return 0, io.EOF
	}
	n := copy(p, r.b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

type failReader struct{ err error }

func (r failReader) ReadAt(p []byte, off int64) (int, error) { return 0, r.err }

func TestReadHeaderReaderErrors(t *testing.T) {
	b := file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 1)
	_, err := ReadHeader(shortReader{b[:20]}, int64(len(b)))
	require.ErrorIs(t, err, ErrFormat)
	require.Contains(t, err.Error(), "truncated")

	boom := errors.New("disk on fire")
	_, err = ReadHeader(failReader{boom}, 100)
	require.ErrorIs(t, err, boom)
	require.NotErrorIs(t, err, ErrFormat, "an I/O error is not a format error")
}

func TestNewHeaderLayout(t *testing.T) {
	h, err := NewHeader([]Tensor{
		{Name: "z", DType: "F32", Shape: dtype.Shape{2, 2}, Begin: 99, End: 1},
		{Name: "a/b", DType: "BF16", Shape: dtype.Shape{3}},
		{Name: "empty", DType: "F64", Shape: dtype.Shape{0, 7}},
		{Name: "s", DType: "I64", Shape: dtype.Shape{}},
	}, map[string]string{"k": "v<&>"})
	require.NoError(t, err)
	var names []string
	var off int64
	for _, ts := range h.Tensors {
		names = append(names, ts.Name)
		require.Equal(t, off, ts.Begin, "contiguous in name order")
		off = ts.End
	}
	require.Equal(t, []string{"a/b", "empty", "s", "z"}, names)
	require.Equal(t, int64(6+0+8+16), dataSize(h))

	enc, err := h.Encode()
	require.NoError(t, err)
	require.Equal(t, h.DataOffset, int64(len(enc)))
	require.Zero(t, len(enc)%8, "header padded to a multiple of 8")
	require.Equal(t, uint64(len(enc)-8), binary.LittleEndian.Uint64(enc))
	js := string(enc[8:])
	require.Equal(t, `{"__metadata__":{"k":"v<&>"},"a/b":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},`+
		`"empty":{"dtype":"F64","shape":[0,7],"data_offsets":[6,6]},"s":{"dtype":"I64","shape":[],"data_offsets":[6,14]},`+
		`"z":{"dtype":"F32","shape":[2,2],"data_offsets":[14,30]}}`, strings.TrimRight(js, " "))

	// The encoding reads back as the same header.
	back, err := read(append(enc, make([]byte, dataSize(h))...))
	require.NoError(t, err)
	require.Equal(t, h, back)
}

func TestNewHeaderNoMetadata(t *testing.T) {
	for _, md := range []map[string]string{nil, {}} {
		h, err := NewHeader([]Tensor{{Name: "a", DType: "U8", Shape: dtype.Shape{1}}}, md)
		require.NoError(t, err)
		enc, err := h.Encode()
		require.NoError(t, err)
		require.NotContains(t, string(enc), MetadataKey)
	}
	h, err := NewHeader(nil, nil)
	require.NoError(t, err)
	enc, err := h.Encode()
	require.NoError(t, err)
	require.Equal(t, "{}      ", string(enc[8:]))
}

func TestNewHeaderRejects(t *testing.T) {
	for name, tc := range map[string]struct {
		ts   []Tensor
		md   map[string]string
		want string
	}{
		"duplicate":     {[]Tensor{{Name: "a", DType: "U8"}, {Name: "a", DType: "U8"}}, nil, "appears twice"},
		"metadata name": {[]Tensor{{Name: MetadataKey, DType: "U8"}}, nil, "reserved"},
		"bad dtype":     {[]Tensor{{Name: "a", DType: "X"}}, nil, "dtype"},
		"sub-byte":      {[]Tensor{{Name: "a", DType: "F4", Shape: dtype.Shape{3}}}, nil, "whole bytes"},
		"bad UTF-8":     {[]Tensor{{Name: "\xff", DType: "U8"}}, nil, "UTF-8"},
		"bad metadata":  {nil, map[string]string{"k": "\xff"}, "UTF-8"},
		"too large":     {[]Tensor{{Name: "a", DType: "F64", Shape: dtype.Shape{1 << 60}}}, nil, "size past"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewHeader(tc.ts, tc.md)
			require.ErrorIs(t, err, ErrFormat)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestNewHeaderTotalOverflow(t *testing.T) {
	var ts []Tensor
	for i := range 2048 {
		ts = append(ts, Tensor{Name: strings.Repeat("x", i+1), DType: "U8", Shape: dtype.Shape{dtype.MaxSize}})
	}
	_, err := NewHeader(ts, nil)
	require.ErrorIs(t, err, ErrFormat)
	require.Contains(t, err.Error(), "total more than")
}

// TestFixtures reads the real files the reference writer produced and checks
// that re-encoding their headers round-trips.
func TestFixtures(t *testing.T) {
	dir := fixtureDir(t)
	if dir == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("safetensors fixtures not found at ../shared/fixtures/safetensors from the module root")
		}
		t.Skip("safetensors fixtures not found at ../shared/fixtures/safetensors from the module root")
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			b, err := os.ReadFile(f)
			require.NoError(t, err)
			h, err := read(b)
			require.NoError(t, err)
			require.NotEmpty(t, h.Tensors)
			require.Equal(t, int64(len(b)), h.DataOffset+dataSize(h), "reference files have no trailing bytes")
			h2, err := NewHeader(h.Tensors, h.Metadata)
			require.NoError(t, err)
			enc, err := h2.Encode()
			require.NoError(t, err)
			data := make([]byte, 0, dataSize(h2))
			for _, ts := range h2.Tensors {
				data = append(data, b[h.DataOffset+h.Tensors[indexOf(h, ts.Name)].Begin:][:ts.Size()]...)
			}
			back, err := read(append(enc, data...))
			require.NoError(t, err)
			require.Equal(t, h.Metadata, back.Metadata)
			require.Len(t, back.Tensors, len(h.Tensors))
			for i, ts := range back.Tensors {
				require.Equal(t, h.Tensors[i].Name, ts.Name)
				require.Equal(t, h.Tensors[i].DType, ts.DType)
				require.Equal(t, h.Tensors[i].Shape, ts.Shape)
			}
		})
	}
}

func indexOf(h *Header, name string) int {
	for i, t := range h.Tensors {
		if t.Name == name {
			return i
		}
	}
	return -1
}

// dataSize is the length of the data region h's tensors describe: the
// largest End (0 with no tensors).
func dataSize(h *Header) int64 {
	var n int64
	for _, t := range h.Tensors {
		n = max(n, t.End)
	}
	return n
}
