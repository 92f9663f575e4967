package namespace

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/xattrs"
)

// binList is a binary range list of one record per line of lines, the
// descriptors of each given by descs (nil: none).
func binList(lines []string, descs [][][3]int64) string {
	var b []byte
	for i, l := range lines {
		var ds []xattrs.RangeDesc
		for _, d := range descs[i] {
			ds = append(ds, xattrs.RangeDesc{Src: d[0], Dst: d[1], Len: d[2]})
		}
		b = xattrs.AppendRangeRecord(b, l, ds)
	}
	return string(b)
}

func TestDecodeBinary(t *testing.T) {
	v := binList([]string{"/s b:/d", "/n b:/n"}, [][][3]int64{{{1, 2, 3}, {4, 5, 6}}, nil})
	recs, err := decodeBinary(v)
	require.NoError(t, err)
	require.Len(t, recs, 2)
	require.Equal(t, "/s b:/d", recs[0].line)
	require.Equal(t, 2, recs[0].count())
	s, d, n, err := recs[0].desc(1)
	require.NoError(t, err)
	require.Equal(t, [3]int64{4, 5, 6}, [3]int64{s, d, n})
	require.Equal(t, 0, recs[1].count())
	require.Equal(t, 3, binaryLines(recs))
	require.Equal(t, 2, descriptors(recs))
	require.Equal(t, "<binary range list, 81 bytes>", describeValue(v))
	require.Equal(t, "/a b:/b", describeValue("/a b:/b"))

	neg := binList([]string{"/s b:/d"}, [][][3]int64{{{0, 0, -8}}})
	recs, err = decodeBinary(neg)
	require.NoError(t, err)
	_, _, _, err = recs[0].desc(0)
	require.True(t, errors.Is(err, syscall.EINVAL), "%v", err)

	for _, bad := range []string{
		"\x00",
		"\x00ranges2\n/s\n\x00\x00\x00\x00",
		xattrs.RangeListMagic,
		xattrs.RangeListMagic + "/s b:/d",
		xattrs.RangeListMagic + "/s b:/d\n\x01\x00",
		v[:len(v)-1],
		xattrs.RangeListMagic + "/s\x00 b:/d\n\x00\x00\x00\x00",
		xattrs.RangeListMagic + "/s b:/d\n\xff\xff\xff\xff",
	} {
		_, err := decodeBinary(bad)
		require.True(t, errors.Is(err, syscall.EINVAL), "%q: %v", bad, err)
	}
	require.True(t, isBinary("\x00x"))
	require.False(t, isBinary(""))
	require.False(t, isBinary("/a b:/b"))
}

// TestBinaryValueBorrowed: a binary range list is read from the request's
// buffer (valueOf), so what outlives the call, its records' lines, must
// not alias it; a text value is copied whole.
func TestBinaryValueBorrowed(t *testing.T) {
	buf := []byte(binList([]string{"/s b:/d", "b:/n"}, [][][3]int64{{{1, 2, 3}}, nil}))
	recs, err := decodeBinary(valueOf(buf))
	require.NoError(t, err)
	text := []byte("@0+1 b:/d@0")
	tv := valueOf(text)
	for i := range buf {
		buf[i] = 'x' // the next request in the buffer
	}
	copy(text, "xxxxxxxxxxx")
	require.Equal(t, "/s b:/d", recs[0].line)
	require.Equal(t, "b:/n", recs[1].line)
	require.Equal(t, "@0+1 b:/d@0", tv)
}

// FuzzDecodeBinary: any value decodes or is EINVAL, never a panic, and the
// records' descriptors are whole.
func FuzzDecodeBinary(f *testing.F) {
	f.Add(binList([]string{"/s b:/d", "/n b:/n"}, [][][3]int64{{{1, 2, 3}}, nil}))
	f.Add(xattrs.RangeListMagic + "x\n\x02\x00\x00\x00")
	f.Fuzz(func(t *testing.T, v string) {
		recs, err := decodeBinary(v)
		if err != nil {
			require.True(t, errors.Is(err, syscall.EINVAL), "%v", err)
			return
		}
		for _, r := range recs {
			require.Zero(t, len(r.descs)%descLen)
			for i := range r.count() {
				r.desc(i)
			}
		}
	})
}

// TestSpanRoomBounded: a call's range lists between many pairs of tensors
// make room for the call's lines once, not once a list (a 64 KiB value of
// 2000 lines between 1000 pairs took 64 MB of spans).
func TestSpanRoomBounded(t *testing.T) {
	tr := unmountedFS(t)
	ten, err := tr.store.New(u8tmpl())
	require.NoError(t, err)
	require.NoError(t, ten.Truncate(4096))
	require.NoError(t, tr.Root().Add("s", NewFile(ten, 0o644, 0, 0)))
	var b strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&b, "/s@0+1 b:/c%d@0\n/s@1+1 b:/c%d@1\n", i, i)
	}
	value := strings.TrimSuffix(b.String(), "\n")
	p := newLinePlan(strings.Count(value, "\n") + 1)
	rest, n, err := tr.planRangeLines(p, nil, value)
	require.NoError(t, err)
	require.Equal(t, "", rest)
	require.Equal(t, 2000, n)
	require.Len(t, p.lists, 1000)
	room := 0
	for _, s := range p.lists {
		require.Len(t, s.meta.Spans, 2)
		room += cap(s.meta.Spans)
	}
	// The first list's room may come from spanPool: up to twice its hint.
	require.Less(t, room, 2*2000+1000*8, "spans made room for %d", room)
	closeAll(p.opened)
}
