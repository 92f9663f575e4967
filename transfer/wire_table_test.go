package transfer

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTableRoundTrip: requests and replies carry their descriptors as a
// table that decodes to the same lists; every truncation of it, and trailing
// bytes, are EPROTO.
func TestTableRoundTrip(t *testing.T) {
	metas := []Meta{
		{Rel: "kv/0", DType: "BF16", Shape: "16,8", NBytes: 256, InPlace: true, Off: 1 << 40},
		{Rel: "kv/0", DType: "BF16", Shape: "16,8", NBytes: 256, InPlace: true, Off: 0, Exact: true},
		{Rel: "note", DType: "U8", Shape: "3", NBytes: math.MaxInt64},
	}
	descs := []IPCDesc{
		{Handle: "memfd:/proc/1/fd/3", Offset: 8, Alloc: 1, Export: 2, Generation: 3, Leased: true},
		{Handle: "memfd:/proc/1/fd/3", Offset: 9, Alloc: 1, Export: 2, Generation: 3},
		{Handle: "cuda:ab", Offset: math.MaxInt64, Alloc: math.MaxUint64, Export: 5, Generation: 6},
	}
	b := encodeMsg(request{Op: "put", Path: "/", Dir: true, Tensors: metas, IPC: descs})
	js, _, _ := bytes.Cut(b, []byte{0})
	require.NotContains(t, string(js), "kv/0", "descriptors go as a table, after the JSON")
	require.True(t, json.Valid(js))
	var r request
	require.NoError(t, decodeMsg(b, &r))
	require.Equal(t, metas, r.Tensors)
	require.Equal(t, descs, r.IPC)
	require.Equal(t, "put", r.Op)
	var rp reply
	require.NoError(t, decodeMsg(encodeMsg(reply{Dir: true, Tensors: metas}), &rp))
	require.Equal(t, metas, rp.Tensors)
	require.Empty(t, rp.IPC)
	require.Error(t, decodeMsg(append([]byte(`{}`), 0, 1), &rp), "a malformed table")
	var d doneMsg
	require.Error(t, decodeMsg(encodeMsg(reply{Tensors: metas}), &d), "a table on a message that takes none")

	tab := encodeTable(metas, descs)
	for n := range len(tab) {
		_, _, err := decodeTable(tab[:n])
		require.Error(t, err, "truncated to %d of %d bytes", n, len(tab))
	}
	_, _, err := decodeTable(append(tab, 0))
	require.Error(t, err, "trailing bytes")
	// A count larger than the bytes behind it allocates nothing.
	_, _, err = decodeTable([]byte{0xff, 0xff, 0xff, 0xff})
	require.Error(t, err)
}

// FuzzTable: no input makes decodeTable panic, and what it accepts encodes
// back to the same bytes' meaning.
func FuzzTable(f *testing.F) {
	f.Add(encodeTable([]Meta{{Rel: "a", NBytes: 1, InPlace: true, Off: 2}}, []IPCDesc{{Handle: "h", Offset: 1}}))
	f.Fuzz(func(t *testing.T, p []byte) {
		metas, descs, err := decodeTable(p)
		if err != nil {
			return
		}
		m2, d2, err := decodeTable(encodeTable(metas, descs))
		require.NoError(t, err)
		require.Equal(t, len(metas), len(m2))
		require.Equal(t, len(descs), len(d2))
	})
}
