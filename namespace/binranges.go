package namespace

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"github.com/tensorfs/tensorfs/transfer"
	"github.com/tensorfs/tensorfs/xattrs"
)

// A binary range list (xattrs.RangeListMagic; README "Binary range
// lists"): an action's value as a descriptor list of fixed-size records,
// the form NIXL's and Mooncake's clients hand their engines (an array of
// offsets and lengths), rather than a line of text per block. A client
// builds it from arrays in microseconds (numpy's tobytes), where
// formatting 1000 range lines cost Python 0.3-1.1 ms, more than the copy
// they describe; and the daemon reads it without parsing a number (53 ns a
// line for the text, most of the sender's CPU in a 1000-block copy). Each
// descriptor stands for its text line, and the records are planned in
// order as those lines would be (planBinary).

// descLen is the bytes of one descriptor of a binary range list: three
// int64s.
const descLen = xattrs.RangeDescLen

// binRecord is one record of a binary range list: its line and its
// descriptors' bytes (descLen each).
type binRecord struct {
	line  string
	descs string
}

// count is how many descriptors r holds.
func (r binRecord) count() int { return len(r.descs) / descLen }

// desc is r's descriptor i: source offset, destination offset, length,
// in bytes. Errors: EINVAL for a negative one.
func (r binRecord) desc(i int) (src, dst, n int64, err error) {
	b := r.descs[i*descLen:]
	src = int64(le64(b))
	dst = int64(le64(b[8:]))
	n = int64(le64(b[16:]))
	if src < 0 || dst < 0 || n < 0 {
		return 0, 0, 0, errf(syscall.EINVAL, "binary range list: descriptor %d of %q is negative (%d, %d, %d)", i, r.line, src, dst, n)
	}
	return src, dst, n, nil
}

// le64 is the little-endian uint64 at the start of s.
func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// valueOf is an action's value v as the string its parsers read. The
// value is the FUSE request's buffer, reused once the call returns: a text
// value is copied, since its lines' paths end up in what outlives the call
// (records, sources); a binary range list is read where it lies (a 1000-
// descriptor list is 24 KB, and its copy cost the sender 13 µs a call on
// the 2-core VM, 2026-12-07), and decodeBinary copies the one part of it
// anything keeps, its records' lines.
func valueOf(v []byte) string {
	if len(v) == 0 || v[0] != 0 {
		return string(v)
	}
	return unsafe.String(&v[0], len(v))
}

// isBinary reports whether value is meant as a binary range list: it
// starts with a NUL (decodeBinary says whether it is one).
func isBinary(value string) bool { return value != "" && value[0] == 0 }

// decodeBinary splits a binary range list into its records. Errors:
// EINVAL for a value that is not one (another header, a record cut short,
// a line holding a NUL), or one with no records.
func decodeBinary(value string) ([]binRecord, error) {
	if !strings.HasPrefix(value, xattrs.RangeListMagic) {
		return nil, errf(syscall.EINVAL, "a value that starts with a NUL is a binary range list, which starts %q", xattrs.RangeListMagic)
	}
	rest := value[len(xattrs.RangeListMagic):]
	var recs []binRecord
	for rest != "" {
		nl := strings.IndexByte(rest, '\n')
		if nl < 0 {
			return nil, errf(syscall.EINVAL, "binary range list: record %d has no line end", len(recs)+1)
		}
		line := rest[:nl]
		if strings.IndexByte(line, 0) >= 0 {
			return nil, errf(syscall.EINVAL, "binary range list: record %d's line holds a NUL", len(recs)+1)
		}
		rest = rest[nl+1:]
		if len(rest) < 4 {
			return nil, errf(syscall.EINVAL, "binary range list: record %d (%q) has no descriptor count", len(recs)+1, line)
		}
		count := uint64(binary.LittleEndian.Uint32([]byte(rest[:4])))
		rest = rest[4:]
		if count*descLen > uint64(len(rest)) {
			return nil, errf(syscall.EINVAL, "binary range list: record %d (%q) has %d descriptors, %d bytes for them", len(recs)+1, line, count, len(rest))
		}
		// The line's paths outlive the call (valueOf): a copy of it.
		recs = append(recs, binRecord{line: strings.Clone(line), descs: rest[:count*descLen]})
		rest = rest[count*descLen:]
	}
	if len(recs) == 0 {
		return nil, errf(syscall.EINVAL, "binary range list: no records")
	}
	return recs, nil
}

// binaryLines is how many lines a binary range list stands for (its
// descriptors, and its records without any), for a plan's room.
func binaryLines(recs []binRecord) int {
	n := 0
	for _, r := range recs {
		n += max(r.count(), 1)
	}
	return n
}

// descriptors is how many descriptors recs hold.
func descriptors(recs []binRecord) int {
	n := 0
	for _, r := range recs {
		n += r.count()
	}
	return n
}

// describeValue is value for a log line: a binary range list by its size,
// as its bytes mean nothing in text.
func describeValue(value string) string {
	if isBinary(value) {
		return fmt.Sprintf("<binary range list, %d bytes>", len(value))
	}
	return value
}

// textLine is a record's descriptor i as the text line of its action
// (withSrc: a batch's "SRC@src+n DST@dst"; else a copy_to's "@src+n
// DST@dst"), for the general parser. A path keeps its own '@'s: the
// range is the last one.
func textLine(b []byte, srcRef, dstRef string, withSrc bool, src, dst, n int64) []byte {
	if withSrc {
		b = append(b, srcRef...)
	}
	b = append(b, '@')
	b = strconv.AppendInt(b, src, 10)
	b = append(b, '+')
	b = strconv.AppendInt(b, n, 10)
	b = append(b, ' ')
	b = append(b, dstRef...)
	b = append(b, '@')
	return strconv.AppendInt(b, dst, 10)
}

// recordRefs reads the line of a record with descriptors: "SRC DST" for
// a batch (withSrc), "DST" for a copy_to, "SRC" for a copy_from (then in
// dstRef), fields apart by spaces or tabs, each a path as a text line's
// would be without its range, never a comment. Errors: EINVAL.
func recordRefs(line string, withSrc bool) (l rangeLine, err error) {
	l.dstRef = strings.TrimSpace(line)
	want := "DST (or SRC)"
	if withSrc {
		want = "SRC DST"
		if j := strings.IndexAny(l.dstRef, " \t"); j > 0 {
			l.srcRef, l.dstRef = l.dstRef[:j], strings.TrimLeft(l.dstRef[j:], " \t")
		} else {
			l.dstRef = ""
		}
	}
	if l.dstRef == "" || strings.ContainsAny(l.dstRef, " \t") {
		return l, errf(syscall.EINVAL, "binary range list: want %s before a record's descriptors, got %q", want, line)
	}
	// A batch line's source may start a comment ("#"): a record's may
	// not. The paths are checked where their lines' would be (the
	// destination after the source is found), so that the errors are
	// the text's.
	if strings.HasPrefix(l.srcRef, "#") {
		return l, errf(syscall.EINVAL, "binary range list: %q is no path (a record's line is no comment)", l.srcRef)
	}
	return l, nil
}

// fastMax bounds the numbers a range list takes from a binary record: a
// text line's fast parser reads 18 digits at most (scanNumber), and a
// larger number sends the line, and the call's lines after it, to the
// general parser; a descriptor does the same, as its line.
const fastMax = 999_999_999_999_999_999

// planBinary plans the records of a binary range list of a copy_to on src
// (nil: a batch) into p as planRangeLines plans the same lines of text:
// descriptors join the range list between their two tensors until one
// cannot (a source on a peer, a directory, a number past fastMax, a record
// without descriptors); that one and all after it come back as their text
// lines, for the general parser, so that errors and order are the text's.
// Errors: as planRangeLines's, and EINVAL for a malformed record or a
// negative number.
func (f *Tree) planBinary(p *linePlan, src Node, recs []binRecord) (text string, err error) {
	var b []byte
	withSrc := src == nil
	general := false // the rest is the general parser's
	for _, r := range recs {
		if r.count() == 0 {
			if len(b) > 0 {
				b = append(b, '\n')
			}
			b = append(b, r.line...)
			general = true
			continue
		}
		l, err := recordRefs(r.line, withSrc)
		if err != nil {
			return "", err
		}
		i := 0
		if !general {
			if i, err = f.planRecord(p, src, r, l); err != nil {
				return "", err
			}
			general = i < r.count()
		}
		for ; i < r.count(); i++ {
			if l.src, l.dst, l.n, err = r.desc(i); err != nil {
				return "", err
			}
			if len(b) > 0 {
				b = append(b, '\n')
			}
			b = textLine(b, l.srcRef, l.dstRef, withSrc, l.src, l.dst, l.n)
		}
	}
	return string(b), nil
}

// planRecord adds the descriptors of record r, whose paths l holds, to
// p's range list between them, up to the first a range list cannot take;
// it returns that one's index (r.count() when all were taken). Errors:
// as planRangeLines's, and EINVAL for a negative number.
func (f *Tree) planRecord(p *linePlan, src Node, r binRecord, l rangeLine) (int, error) {
	var err error
	if l.src, l.dst, l.n, err = r.desc(0); err != nil || l.src > fastMax || l.dst > fastMax || l.n > fastMax {
		return 0, err
	}
	cur, opened, err := f.rangeList(p, src, l)
	if err != nil || cur == nil {
		return 0, err
	}
	first := 0
	if opened {
		first = 1 // its range opened the list
	}
	return r.addTo(cur, first, p.spanRoom())
}

// addTo adds r's descriptors from first on to range list s, each inside
// the source tensor (rangeIn's check, written out: this loop is the whole
// of a 1000-block call's planning), up to one with a number past fastMax,
// whose index it returns (r.count() when it took them all). Errors:
// EINVAL.
func (r binRecord) addTo(s *fileSource, first, hint int) (int, error) {
	size := s.ref.meta.NBytes
	count := r.count()
	if first < count {
		s.asList(hint)
	}
	// The spans written straight into the list, the position in a
	// register: through addSpan, a call and the list's header in memory
	// each descriptor, this loop took 10 ns a descriptor (2-core VM).
	spans := slices.Grow(s.meta.Spans, count-first)
	pos := s.meta.NBytes
	defer func() { s.meta.Spans, s.meta.NBytes = spans, pos }()
	d := r.descs[first*descLen:]
	for i := first; i < count; i, d = i+1, d[descLen:] {
		src, dst, n := int64(le64(d)), int64(le64(d[8:])), int64(le64(d[16:]))
		if uint64(src) > fastMax || uint64(dst) > fastMax || uint64(n) > fastMax {
			if _, _, _, err := r.desc(i); err != nil {
				return 0, err // negative
			}
			return i, nil
		}
		if src > size || n > size-src {
			_, _, err := rangeIn(size, transfer.Range{Set: true, Off: src, Len: n, HasLen: true})
			return 0, err
		}
		spans = append(spans, transfer.Span{Pos: pos, Src: src, Dst: dst, N: n})
		pos += n
	}
	return count, nil
}

// pullRecord reads record r of a binary range list of a copy_from, whose
// line is its source "SRC": each descriptor is the in-place line "SRC@s+n
// @d". Errors: EINVAL for a malformed line, a negative number or a range
// past 63 bits (transfer.SplitRange's).
func (f *Tree) pullRecord(r binRecord) ([]copyLine, error) {
	l, err := recordRefs(r.line, false)
	if err != nil {
		return nil, err
	}
	if strings.HasPrefix(l.dstRef, "#") { // its line's first field: no comment either
		return nil, errf(syscall.EINVAL, "binary range list: %q is no path (a record's line is no comment)", l.dstRef)
	}
	peer, path, err := f.parseTarget(l.dstRef)
	if err != nil {
		return nil, err
	}
	lines := make([]copyLine, r.count())
	for i := range lines {
		s, d, n, err := r.desc(i)
		if err != nil {
			return nil, err
		}
		if s > math.MaxInt64-n {
			return nil, errf(syscall.EINVAL, "binary range list: descriptor %d of %q: range @%d+%d does not fit in 63 bits", i, r.line, s, n)
		}
		lines[i] = copyLine{
			src: ref{peer: peer, path: path, r: transfer.Range{Set: true, Off: s, Len: n, HasLen: true}},
			dst: ref{r: transfer.Range{Set: true, Off: d}},
		}
	}
	return lines, nil
}
