package xattrs

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAppendRangeRecord: the bytes README "Binary range lists" describes
// (the daemon's decoder is tested against this encoder in namespace).
func TestAppendRangeRecord(t *testing.T) {
	b := AppendRangeRecord(nil, "/s b:/d", []RangeDesc{{Src: 1, Dst: 0x0102, Len: -1}})
	b = AppendRangeRecord(b, "/n b:/n", nil)
	want := RangeListMagic + "/s b:/d\n" + "\x01\x00\x00\x00" +
		"\x01\x00\x00\x00\x00\x00\x00\x00" + "\x02\x01\x00\x00\x00\x00\x00\x00" + "\xff\xff\xff\xff\xff\xff\xff\xff" +
		"/n b:/n\n" + "\x00\x00\x00\x00"
	require.Equal(t, want, string(b))
	require.Len(t, RangeListMagic, 9)
}
