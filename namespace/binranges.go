package namespace

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"syscall"

	"github.com/tensorfs/tensorfs/transfer"
)

// A binary range list: an action's value as a descriptor list of fixed-size
// records, the form NIXL's and Mooncake's clients hand their engines (an
// array of offsets and lengths), rather than a line of text per block. A
// client builds it from arrays in microseconds (numpy's tobytes), where
// formatting 1000 range lines cost Python 0.3-1.1 ms, more than the copy
// they describe; and the daemon reads it without parsing a number (53 ns a
// line for the text, most of the sender's CPU in a 1000-block copy).
//
//	value  = BinaryMagic record...
//	record = line "\n" count:uint32 count*(src:int64 dst:int64 n:int64)
//
// All integers are little-endian. A record with descriptors names its two
// tensors in line, as a text line would without ranges: "SRC DST" for a
// batch, "DST" for a copy_to (the source is the file), "SRC" for a
// copy_from (the destination is the file); each descriptor is then the
// line "SRC@src+n DST@dst" of that action, in order. A record without
// descriptors is a text line of the action as it stands (a whole-tensor
// line: a batch's notification). README "Binary range lists".

// BinaryMagic starts a binary range list: a NUL, which no text value
// holds, then the format's name and version, and a newline.
const BinaryMagic = "\x00ranges1\n"

// descLen is the bytes of one descriptor of a binary range list: three
// int64s.
const descLen = 24

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

// isBinary reports whether value is meant as a binary range list: it
// starts with a NUL (decodeBinary says whether it is one).
func isBinary(value string) bool { return value != "" && value[0] == 0 }

// decodeBinary splits a binary range list into its records. Errors:
// EINVAL for a value that is not one (another header, a record cut short,
// a line holding a NUL), or one with no records.
func decodeBinary(value string) ([]binRecord, error) {
	if !strings.HasPrefix(value, BinaryMagic) {
		return nil, errf(syscall.EINVAL, "a value that starts with a NUL is a binary range list, which starts %q", BinaryMagic)
	}
	rest := value[len(BinaryMagic):]
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
		recs = append(recs, binRecord{line: line, descs: rest[:count*descLen]})
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

// planBinary plans the records of a binary range list of a copy_to on src
// (nil: a batch) into p, as planRangeLines plans range lines: each
// record's descriptors join the range list between its two tensors. It
// returns, as text lines for the general parser, the records without
// descriptors and those a range list cannot take (a source on a peer, a
// directory: written as their lines, which the general parser plans or
// refuses). Errors: as planRangeLines's, and EINVAL for a malformed record.
func (f *Tree) planBinary(p *linePlan, src Node, recs []binRecord) (text string, err error) {
	var b []byte
	newline := func() {
		if len(b) > 0 {
			b = append(b, '\n')
		}
	}
	withSrc := src == nil
	for _, r := range recs {
		if r.count() == 0 {
			newline()
			b = append(b, r.line...)
			continue
		}
		l := rangeLine{dstRef: strings.TrimSpace(r.line)}
		if withSrc {
			a, d, ok := strings.Cut(l.dstRef, " ")
			l.srcRef, l.dstRef = a, strings.TrimSpace(d)
			if !ok || a == "" || l.dstRef == "" || strings.ContainsAny(l.dstRef, " \t") {
				return "", errf(syscall.EINVAL, "binary range list: want SRC DST before a batch record's descriptors, got %q", r.line)
			}
		} else if l.dstRef == "" || strings.ContainsAny(l.dstRef, " \t") {
			return "", errf(syscall.EINVAL, "binary range list: want DST before a copy_to record's descriptors, got %q", r.line)
		}
		if l.src, l.dst, l.n, err = r.desc(0); err != nil {
			return "", err
		}
		cur, opened, err := f.rangeList(p, src, l)
		switch {
		case err != nil:
			return "", err
		case cur == nil:
			for i := range r.count() {
				if l.src, l.dst, l.n, err = r.desc(i); err != nil {
					return "", err
				}
				newline()
				b = textLine(b, l.srcRef, l.dstRef, withSrc, l.src, l.dst, l.n)
			}
			continue
		}
		first := 0
		if opened {
			first = 1 // its range opened the list
		}
		if err := r.addTo(cur, first, p.hint); err != nil {
			return "", err
		}
	}
	return string(b), nil
}

// addTo adds r's descriptors from first on to range list s, each inside
// the source tensor (rangeIn's check, written out: this loop is the whole
// of a 1000-block call's planning). Errors: EINVAL.
func (r binRecord) addTo(s *fileSource, first, hint int) error {
	size := s.ref.meta.NBytes
	for i := first; i < r.count(); i++ {
		b := r.descs[i*descLen : (i+1)*descLen]
		src, dst, n := int64(le64(b)), int64(le64(b[8:])), int64(le64(b[16:]))
		if src < 0 || dst < 0 || n < 0 || src > size || n > size-src {
			if _, _, _, err := r.desc(i); err != nil {
				return err
			}
			_, _, err := rangeIn(size, transfer.Range{Set: true, Off: src, Len: n, HasLen: true})
			return err
		}
		s.addSpan(src, dst, n, hint)
	}
	return nil
}

// binaryPulls reads the records of a binary range list of a copy_from:
// each descriptor of a record "SRC" is the in-place line "SRC@src+n
// @dst"; the records without descriptors come back as text lines, for the
// general parser. Errors: EINVAL for a malformed record or path.
func (f *Tree) binaryPulls(recs []binRecord) (inPlace []copyLine, text string, err error) {
	var b strings.Builder
	for _, r := range recs {
		if r.count() == 0 {
			if b.Len() > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(r.line)
			continue
		}
		line := strings.TrimSpace(r.line)
		if line == "" || strings.ContainsAny(line, " \t") {
			return nil, "", errf(syscall.EINVAL, "binary range list: want SRC before a copy_from record's descriptors, got %q", r.line)
		}
		peer, path, err := f.parseTarget(line)
		if err != nil {
			return nil, "", err
		}
		for i := range r.count() {
			s, d, n, err := r.desc(i)
			if err != nil {
				return nil, "", err
			}
			inPlace = append(inPlace, copyLine{
				src: ref{peer: peer, path: path, r: transfer.Range{Set: true, Off: s, Len: n, HasLen: true}},
				dst: ref{r: transfer.Range{Set: true, Off: d}},
			})
		}
	}
	return inPlace, b.String(), nil
}
