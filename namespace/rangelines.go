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
	line := rest
	if i := strings.IndexByte(rest, '\n'); i >= 0 {
		line, after = rest[:i], rest[i+1:]
	}
	sp := strings.IndexByte(line, ' ')
	if sp <= 0 {
		return l, "", false
	}
	srcTok, dstTok := line[:sp], line[sp+1:]
	if strings.IndexByte(dstTok, ' ') >= 0 || strings.IndexByte(line, '\t') >= 0 {
		return l, "", false // more fields, or other white space
	}
	at := strings.LastIndexByte(srcTok, '@')
	if at < 0 || !withSrc && at != 0 || withSrc && at == 0 {
		return l, "", false
	}
	l.srcRef = srcTok[:at]
	var hasLen bool
	if l.src, l.n, hasLen, ok = scanRange(srcTok[at+1:]); !ok || !hasLen {
		return l, "", false
	}
	at = strings.LastIndexByte(dstTok, '@')
	if at <= 0 {
		return l, "", false
	}
	l.dstRef = dstTok[:at]
	var dlen int64
	if l.dst, dlen, hasLen, ok = scanRange(dstTok[at+1:]); !ok || hasLen && dlen != l.n {
		return l, "", false
	}
	return l, after, true
}

// scanRange parses "OFF" or "OFF+LEN", decimal, each at most 18 digits (so
// it fits in an int64 and OFF+LEN does too).
func scanRange(s string) (off, n int64, hasLen, ok bool) {
	var i int
	if off, i, ok = scanNumber(s, 0); !ok {
		return 0, 0, false, false
	}
	if i == len(s) {
		return off, 0, false, true
	}
	if s[i] != '+' {
		return 0, 0, false, false
	}
	if n, i, ok = scanNumber(s, i+1); !ok || i != len(s) {
		return 0, 0, false, false
	}
	return off, n, true, true
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
