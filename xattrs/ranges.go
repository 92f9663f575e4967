package xattrs

// Binary range lists: the in-place lines of a copy_to, copy_from or batch
// as records of fixed-size descriptors, the form NIXL's and Mooncake's
// clients hand their engines (README "Binary range lists"). The daemon
// reads them (namespace); a Go client writes them with AppendRangeRecord.
//
//	value  = RangeListMagic record...
//	record = line "\n" count:uint32 count*(src:int64 dst:int64 len:int64)
//
// All integers little-endian. A record with descriptors names its two
// tensors in line as a text line would without ranges ("SRC DST" for a
// batch, "DST" for a copy_to, "SRC" for a copy_from); descriptor (s, d, n)
// stands for the line "SRC@s+n DST@d" of that action. A record with none
// is a text line of the action (a whole-tensor line: a notification).

// RangeListMagic starts a binary range list: a NUL, which no text value
// holds, the format's name and version, and a newline (9 bytes).
const RangeListMagic = "\x00ranges1\n"

// RangeDescLen is the bytes of one descriptor of a binary range list.
const RangeDescLen = 24

// RangeDesc is one descriptor of a binary range list: Len bytes from byte
// Src of the record's source to byte Dst of its destination. None may be
// negative (the daemon answers EINVAL).
type RangeDesc struct{ Src, Dst, Len int64 }

// AppendRangeRecord appends one record to b, a binary range list (b empty:
// RangeListMagic first): line, which must hold no newline or NUL, then
// descs. A value is at most 64 KiB (the kernel's XATTR_SIZE_MAX): about
// 2700 descriptors; a longer list is the client's to split into calls,
// the notification in the last.
func AppendRangeRecord(b []byte, line string, descs []RangeDesc) []byte {
	if len(b) == 0 {
		b = append(b, RangeListMagic...)
	}
	b = append(b, line...)
	b = append(b, '\n')
	b = appendLE(b, uint64(len(descs)), 4)
	for _, d := range descs {
		b = appendLE(b, uint64(d.Src), 8)
		b = appendLE(b, uint64(d.Dst), 8)
		b = appendLE(b, uint64(d.Len), 8)
	}
	return b
}

// appendLE appends the n low bytes of v, least significant first (the
// package imports nothing, encoding/binary included).
func appendLE(b []byte, v uint64, n int) []byte {
	for i := range n {
		b = append(b, byte(v>>(8*i)))
	}
	return b
}
