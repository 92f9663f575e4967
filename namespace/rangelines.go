package namespace

import (
	"strings"
	"syscall"

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
// its message. prev, when set, is the line before, whose paths a line
// usually repeats: they are then compared, not searched for.
func nextRangeLine(rest string, withSrc bool, prev *rangeLine) (l rangeLine, after string, ok bool) {
	// The bytes are read once: a field's path is the one of the line
	// before when it starts the field and an '@' follows it, and the
	// numbers' digits end the fields and the line. Only a path that
	// changes is searched for (its range's '@' is the last of the field:
	// a name may hold others). Scanning for the separators cost 43-73 ns a
	// line, most of a 1000-line call's parse.
	var j int
	parsed := false
	switch {
	case !withSrc:
		if rest == "" || rest[0] != '@' {
			return l, "", false
		}
		j = 1
	case prev != nil && startsWithRef(rest, prev.srcRef):
		l.srcRef = prev.srcRef
		if j, parsed = rangeAt(rest, len(prev.srcRef)+1, &l); parsed {
			break
		}
		fallthrough
	default:
		sp := strings.IndexByte(rest, ' ')
		if sp < 0 {
			return l, "", false
		}
		at := strings.LastIndexByte(rest[:sp], '@')
		if at <= 0 || hasSpace(rest[:at]) {
			return l, "", false
		}
		l.srcRef = rest[:at]
		j = at + 1
	}
	if !parsed {
		if j, ok = rangeAt(rest, j, &l); !ok {
			return l, "", false
		}
	}
	start := j + 1 // past the space
	b := rest[start:]
	if prev != nil && startsWithRef(b, prev.dstRef) {
		l.dstRef = prev.dstRef
		if after, ok = destAt(b, len(prev.dstRef)+1, &l); ok {
			return l, after, true
		}
	}
	line := b
	if e := strings.IndexByte(b, '\n'); e >= 0 {
		line = b[:e]
	}
	at := strings.LastIndexByte(line, '@')
	if at <= 0 || hasSpace(line[:at]) {
		return l, "", false
	}
	l.dstRef = b[:at]
	after, ok = destAt(b, at+1, &l)
	return l, after, ok
}

// startsWithRef reports whether s starts with the path ref (not empty)
// and the '@' of a range after it.
func startsWithRef(s, ref string) bool {
	return ref != "" && len(s) > len(ref) && s[len(ref)] == '@' && s[:len(ref)] == ref
}

// rangeAt parses a source range "OFF+LEN" of s at i into l, which must be
// followed by the one space before the destination; j is that space's
// index.
func rangeAt(s string, i int, l *rangeLine) (j int, ok bool) {
	if l.src, j, ok = scanNumber(s, i); !ok || j >= len(s) || s[j] != '+' {
		return 0, false
	}
	if l.n, j, ok = scanNumber(s, j+1); !ok || j >= len(s) || s[j] != ' ' {
		return 0, false
	}
	return j, true
}

// destAt parses a destination range "OFF[+LEN]" of b at i into l (LEN, if
// any, equal to l.n), which must end b or its line; after is the rest
// past the line.
func destAt(b string, i int, l *rangeLine) (after string, ok bool) {
	var j int
	if l.dst, j, ok = scanNumber(b, i); !ok {
		return "", false
	}
	if j < len(b) && b[j] == '+' {
		var dlen int64
		if dlen, j, ok = scanNumber(b, j+1); !ok || dlen != l.n {
			return "", false
		}
	}
	switch {
	case j == len(b):
		return "", true
	case b[j] == '\n':
		return b[j+1:], true
	}
	return "", false
}

// hasSpace reports whether s holds a space, tab, carriage return or
// newline: the white space a range line's path may not hold.
func hasSpace(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == ' ' || c == '\t' || c == '\r' || c == '\n' {
			return true
		}
	}
	return false
}

// scanNumber parses the decimal digits of s from i (1 to 18 of them) and
// returns the index after them. (Eight bytes at a time, the SWAR parse,
// was no faster on these 4- to 8-digit numbers: measured 2026-12-02.)
func scanNumber(s string, i int) (int64, int, bool) {
	start := i
	var v int64
	for ; i < len(s); i++ {
		d := s[i] - '0' // wraps below '0': one comparison a digit
		if d > 9 {
			break
		}
		v = v*10 + int64(d)
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
	var last rangeLine // the line before, whose paths the next one repeats
	var prev *rangeLine
	for rest = value; rest != ""; n++ {
		if cur != nil {
			// The usual line: the paths of the one before, into the same
			// list (fastLine); anything else goes the general way below.
			if after, ok := fastLine(rest, curSrc, curDst, cur, p.spanRoom()); ok {
				rest = after
				continue
			}
		}
		l, after, ok := nextRangeLine(rest, src == nil, prev)
		last, prev = l, &last
		if !ok {
			return rest, n, nil
		}
		if cur == nil || l.srcRef != curSrc || l.dstRef != curDst {
			var opened bool
			if cur, opened, err = f.rangeList(p, src, l); err != nil || cur == nil {
				return rest, n, err // cur nil: the general parser's
			}
			curSrc, curDst = l.srcRef, l.dstRef
			if opened {
				rest = after
				continue
			}
		}
		if err := cur.addRange(l, p.spanRoom()); err != nil {
			return "", 0, err
		}
		rest = after
	}
	return rest, n, nil
}

// rangeList is the range list of p that line l joins: the descriptor of
// l's source tensor into its destination (src, for a copy_to; nil for a
// batch, whose lines name their sources), found, or opened with l's range
// (opened true: l is in it). A nil list, with no error, is a line a range
// list cannot take (a source on a peer, a directory, a malformed path):
// the general parser's. Errors: a missing source, a malformed destination
// path.
func (f *Tree) rangeList(p *linePlan, src Node, l rangeLine) (cur *fileSource, opened bool, err error) {
	file, _ := src.(*File)
	if src == nil {
		peer, path, err := f.parseTarget(l.srcRef)
		if err != nil || peer != "" {
			return nil, false, nil
		}
		if err := f.mayReach(p.caller, path); err != nil {
			return nil, false, err
		}
		node, err := f.Resolve(path)
		if err != nil {
			return nil, false, err
		}
		file, _ = node.(*File) // a tree: a copy of its own
	}
	if file == nil {
		return nil, false, nil
	}
	if err := mayRead(p.caller, file); err != nil {
		return nil, false, err
	}
	peer, path, err := f.parseTarget(l.dstRef)
	if err != nil {
		return nil, false, err
	}
	if peer != "" && path == "/" {
		return nil, false, errf(syscall.EISDIR, "%s:/ is a directory (name the target file)", peer)
	}
	key := listKey{file.t, peer, path}
	if cur = p.lists[key]; cur != nil {
		return cur, false, nil
	}
	s, err := p.set.open(file, strings.TrimPrefix(path, "/"), transfer.Range{Set: true, Off: l.src, Len: l.n, HasLen: true})
	if err != nil {
		return nil, false, err
	}
	p.opened = append(p.opened, s)
	s.meta.InPlace, s.meta.Off = true, l.dst
	p.lists[key] = s
	p.add(peer, s)
	return s, true, nil
}

// addRange adds line l's range to range list s, once it lies inside the
// source tensor. Errors: EINVAL.
func (s *fileSource) addRange(l rangeLine, hint int) error {
	off, k, err := rangeIn(s.ref.meta.NBytes, transfer.Range{Set: true, Off: l.src, Len: l.n, HasLen: true})
	if err != nil {
		return err
	}
	s.addSpan(off, l.dst, k, hint)
	return nil
}

// fastLine takes the first line of rest when it is a range line with the
// paths srcRef and dstRef of the line before ("" for a copy_to's source),
// "SRCREF@OFF+LEN DSTREF@DST[+LEN]" (rangeAt's and destAt's forms), whose
// source range lies inside cur's tensor: it adds the span to cur and
// returns the rest after the line. ok is false, nothing added, for anything else,
// which nextRangeLine and planRangeLines then take as before (their
// errors included). Why: in a 1000-line call nearly every line is this
// one, and the general loop (the line's struct, the paths compared, the
// range's checks apart) cost 35 ns a line beyond the parse, 65 µs of a
// 1000-line call on an H100 host (2026-12-06); this is one pass over the
// line's bytes. (Parsing a call's lines on several goroutines was slower
// there: 66-73 µs on 2 to 4 goroutines against 53 µs on one for 1000
// lines, the wake-ups of idle threads in a KVM guest costing more than the
// parse they shared; measured 2026-12-06, commit 56bcc08, reverted.)
func fastLine(rest, srcRef, dstRef string, cur *fileSource, hint int) (after string, ok bool) {
	if i := len(srcRef); len(rest) <= i || rest[i] != '@' || rest[:i] != srcRef {
		return "", false
	}
	var l rangeLine
	j, ok := rangeAt(rest, len(srcRef)+1, &l)
	if !ok {
		return "", false
	}
	b := rest[j+1:] // past the space
	if !startsWithRef(b, dstRef) {
		return "", false
	}
	if after, ok = destAt(b, len(dstRef)+1, &l); !ok {
		return "", false
	}
	if size := cur.ref.meta.NBytes; l.src > size || l.n > size-l.src {
		return "", false // rangeIn's error, by the general way
	}
	cur.addSpan(l.src, l.dst, l.n, hint)
	return after, true
}
