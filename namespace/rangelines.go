package namespace

import (
	"strings"

	"github.com/tensorfs/tensorfs/transfer"
)

// The KV-cache call: a thousand lines, each one block of a tensor into a
// block of another, "@SRC+LEN DST@OFF" in a copy_to or "SRC@OFF+LEN
// DST@OFF" in a batch. Through the general parser (actionLines, refParser,
// planLine) such a line cost about 0.5 µs here, against a goal of 0.2 µs
// per descriptor for the whole copy; scanRangeLines reads it in tens of
// nanoseconds: one pass over the bytes, decimal numbers by hand, and each
// path compared with the line before's instead of parsed again.

// rangeLine is one line of a range-list call: n bytes at src of the
// source, whose text (before its range) is srcRef ("" on a copy_to: the
// file whose xattr is set), into the destination dstRef at dst.
type rangeLine struct {
	srcRef, dstRef string
	src, n, dst    int64
}

// nextRangeLine parses the first line of rest as a range line:
// "@SRC+LEN DST@OFF" (withSrc false) or "SRC@OFF+LEN DST@OFF" (withSrc),
// fields separated by one space, numbers decimal, a destination length,
// if any, equal to LEN; it returns the rest after the line. ok is false for
// anything else (white space around a line, a comment, hex, a whole-tensor
// line...): the general parser takes the value then, and gives any error
// its message.
func nextRangeLine(rest string, withSrc bool) (l rangeLine, after string, ok bool) {
	// Separators by IndexByte (vectorized) and each field's '@' from its
	// end, where the range sits: a byte-by-byte scan of the whole line cost
	// 70 ns a line here, most of a 1000-line call's parse.
	line := rest
	if e := strings.IndexByte(rest, '\n'); e >= 0 {
		line, after = rest[:e], rest[e+1:]
	}
	sp := strings.IndexByte(line, ' ')
	if sp < 0 {
		return l, "", false
	}
	a, b := line[:sp], line[sp+1:]
	at := strings.LastIndexByte(a, '@')
	if at < 0 || !withSrc && at != 0 || withSrc && at == 0 || hasSpace(a[:at]) {
		return l, "", false
	}
	l.srcRef = a[:at]
	var j int
	if l.src, j, ok = scanNumber(a, at+1); !ok || j >= len(a) || a[j] != '+' {
		return l, "", false
	}
	if l.n, j, ok = scanNumber(a, j+1); !ok || j != len(a) {
		return l, "", false
	}
	at = strings.LastIndexByte(b, '@')
	if at <= 0 || hasSpace(b[:at]) {
		return l, "", false
	}
	l.dstRef = b[:at]
	if l.dst, j, ok = scanNumber(b, at+1); !ok {
		return l, "", false
	}
	if j < len(b) {
		var dlen int64
		if b[j] != '+' {
			return l, "", false
		}
		if dlen, j, ok = scanNumber(b, j+1); !ok || j != len(b) || dlen != l.n {
			return l, "", false
		}
	}
	return l, after, true
}

// hasSpace reports whether s holds a space, tab or carriage return (the
// white space a range line may not have inside a field; a newline ends the
// line before).
func hasSpace(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == ' ' || c == '\t' || c == '\r' {
			return true
		}
	}
	return false
}

// scanNumber parses the decimal digits of s from i (1 to 18 of them) and
// returns the index after them.
func scanNumber(s string, i int) (int64, int, bool) {
	start := i
	var v int64
	for ; i < len(s) && '0' <= s[i] && s[i] <= '9'; i++ {
		v = v*10 + int64(s[i]-'0')
	}
	if i == start || i-start > 18 {
		return 0, i, false
	}
	return v, i, true
}

// planRangeLines plans the range lines (nextRangeLine) at the start of
// value, a call on node src (a copy_to; nil for a batch, whose lines name
// their sources), into p as planLine would: one range-list descriptor per
// source tensor and destination. It stops at the first line that is not a
// range line, or one a range list cannot take (a source on a peer, a
// directory), and returns the rest of value from there, for the general
// parser, and how many lines it took. Errors: as planLine's (a range that
// does not fit, a missing source, a malformed peer path).
func (f *Tree) planRangeLines(p *linePlan, src Node, value string) (rest string, n int, err error) {
	var cur *fileSource
	var curSrc, curDst string
	file, _ := src.(*File)
	for rest = value; rest != ""; n++ {
		l, after, ok := nextRangeLine(rest, src == nil)
		if !ok {
			return rest, n, nil
		}
		if cur == nil || l.srcRef != curSrc || l.dstRef != curDst {
			if src == nil && (cur == nil || l.srcRef != curSrc) {
				peer, path, err := f.parseTarget(l.srcRef)
				if err != nil || peer != "" {
					return rest, n, nil // the general parser's
				}
				node, err := f.Resolve(path)
				if err != nil {
					return "", 0, err
				}
				if file, ok = node.(*File); !ok {
					return rest, n, nil // a tree: a copy of its own
				}
			}
			if file == nil {
				return rest, n, nil
			}
			peer, path, err := f.parseTarget(l.dstRef)
			if err != nil {
				return "", 0, err
			}
			curSrc, curDst = l.srcRef, l.dstRef
			key := listKey{file.t, peer, path}
			if cur = p.lists[key]; cur == nil {
				s, err := p.set.open(file, strings.TrimPrefix(path, "/"), transfer.Range{Set: true, Off: l.src, Len: l.n, HasLen: true})
				if err != nil {
					return "", 0, err
				}
				p.opened = append(p.opened, s)
				s.meta.InPlace, s.meta.Off = true, l.dst
				p.lists[key] = s
				p.add(peer, s)
				cur = s
				rest = after
				continue
			}
		}
		off, k, err := rangeIn(cur.ref.meta.NBytes, transfer.Range{Set: true, Off: l.src, Len: l.n, HasLen: true})
		if err != nil {
			return "", 0, err
		}
		cur.addSpan(off, l.dst, k, p.hint)
		rest = after
	}
	return rest, n, nil
}
