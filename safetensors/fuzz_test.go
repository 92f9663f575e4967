package safetensors

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"

	"github.com/tensorfs/tensorfs/dtype"
)

// FuzzReadHeader feeds arbitrary bytes to ReadHeader as a whole file. It must
// never panic; anything it accepts must satisfy the documented invariants and
// survive a NewHeader/Encode/ReadHeader round trip. Run it with
//
//	go test -fuzz FuzzReadHeader ./safetensors/
func FuzzReadHeader(f *testing.F) {
	for _, js := range []string{
		`{}`,
		`{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}`,
		`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`,
		`{"a":{"dtype":"F4","shape":[4],"data_offsets":[0,2]},"z":{"dtype":"BF16","shape":[0],"data_offsets":[1,1]}}  `,
		`{"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]},"__metadata__":null}`,
		`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{}}`,
	} {
		f.Add(file(js, 32))
	}
	if dir := fixtureDir(f); dir != "" {
		files, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
		for _, p := range files {
			if b, err := os.ReadFile(p); err == nil && len(b) < 4096 {
				f.Add(b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ReadHeader(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			if h != nil {
				t.Fatalf("error %v with a non-nil header", err)
			}
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error from an in-memory reader is not ErrFormat: %v", err)
			}
			return
		}
		checkInvariants(t, h, int64(len(b)))
		h2, err := NewHeader(h.Tensors, h.Metadata)
		if err != nil {
			t.Fatalf("NewHeader refuses what ReadHeader accepted: %v", err)
		}
		enc, err := h2.Encode()
		if err != nil {
			t.Fatalf("Encode: %v", err)
		}
		file := append(enc, make([]byte, dataSize(h2))...)
		back, err := ReadHeader(bytes.NewReader(file), int64(len(file)))
		if err != nil {
			t.Fatalf("re-encoded header does not parse: %v\n%q", err, enc)
		}
		if len(back.Tensors) != len(h.Tensors) || len(back.Metadata) != len(h.Metadata) {
			t.Fatalf("round trip changed the header: %+v -> %+v", h, back)
		}
		for i, ts := range back.Tensors {
			o := h.Tensors[i]
			if ts.Name != o.Name || ts.DType != o.DType || ts.Shape.String() != o.Shape.String() || ts.Size() != o.Size() {
				t.Fatalf("round trip changed tensor %d: %+v -> %+v", i, o, ts)
			}
		}
		for k, v := range h.Metadata {
			if back.Metadata[k] != v {
				t.Fatalf("round trip changed metadata %q: %q -> %q", k, v, back.Metadata[k])
			}
		}
	})
}

func checkInvariants(t *testing.T, h *Header, size int64) {
	t.Helper()
	if h.DataOffset < 10 || h.DataOffset > size || h.DataOffset-8 > MaxHeaderSize {
		t.Fatalf("DataOffset %d in a %d-byte file", h.DataOffset, size)
	}
	for i, ts := range h.Tensors {
		if i > 0 && h.Tensors[i-1].Name >= ts.Name {
			t.Fatalf("names not sorted and unique: %q, %q", h.Tensors[i-1].Name, ts.Name)
		}
		if ts.Name == MetadataKey || !utf8.ValidString(ts.Name) {
			t.Fatalf("bad name %q", ts.Name)
		}
		nb, err := dtype.NBytes(ts.DType, ts.Shape)
		if err != nil || nb != ts.Size() || ts.Begin < 0 || h.DataOffset+ts.End > size {
			t.Fatalf("tensor %+v: nbytes %d (%v) in a %d-byte file", ts, nb, err, size)
		}
	}
}
