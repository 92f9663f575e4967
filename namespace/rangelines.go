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
	// One pass over the line's bytes: each field's last '@' (a name may
	// hold others), and no white space but the one space between them.
	n := len(rest)
	i, at := 0, -1
	for ; i < n; i++ {
		switch rest[i] {
		case ' ':
			goto src
		case '@':
			at = i
		case '\t', '\n', '\r':
			return l, "", false
		}
	}
	return l, "", false
src:
	if at < 0 || !withSrc && at != 0 || withSrc && at == 0 {
		return l, "", false
	}
	l.srcRef = rest[:at]
	var j int
	if l.src, j, ok = scanNumber(rest, at+1); !ok || j >= i || rest[j] != '+' {
		return l, "", false
	}
	if l.n, j, ok = scanNumber(rest, j+1); !ok || j != i {
		return l, "", false
	}
	start := i + 1
	at = -1
	for i = start; i < n && rest[i] != '\n'; i++ {
		switch rest[i] {
		case '@':
			at = i
		case ' ', '\t', '\r':
			return l, "", false
		}
	}
	if at <= start {
		return l, "", false
	}
	l.dstRef = rest[start:at]
	if l.dst, j, ok = scanNumber(rest, at+1); !ok {
		return l, "", false
	}
	if j < i {
		var dlen int64
		if rest[j] != '+' {
			return l, "", false
		}
		if dlen, j, ok = scanNumber(rest, j+1); !ok || j != i || dlen != l.n {
			return l, "", false
		}
	}
	if i < n {
		after = rest[i+1:]
	}
	return l, after, true
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
