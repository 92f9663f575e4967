package transfer

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"syscall"
)

// ParsePeerPath splits "NAME:/path" into the peer name and the mount-relative
// path; a path with no "NAME:" gives peer "" (this node). The path is cleaned
// by CleanPath. Errors: EINVAL (as *Error) for an empty name, a relative path,
// "..", "." or empty components, or a NUL.
func ParsePeerPath(s string) (peer, path string, err error) {
	s = strings.TrimRight(s, "\n")
	if i := strings.IndexByte(s, ':'); i >= 0 && !strings.Contains(s[:i], "/") {
		peer, s = s[:i], s[i+1:]
		if peer == "" {
			return "", "", &Error{Errno: syscall.EINVAL, Msg: "empty peer name before ':'"}
		}
	}
	path, err = CleanPath(s)
	return peer, path, err
}

// CleanPath checks a mount-relative path: it must start with "/", and no
// component may be "..", "." or empty (a trailing "/" is dropped), nor longer
// than 255 bytes; a NUL is refused. It returns the path without a trailing
// "/" ("/" for the root). Errors: EINVAL (ENAMETOOLONG for a long component).
func CleanPath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", &Error{Errno: syscall.EINVAL, Msg: fmt.Sprintf("path %q is not absolute in the mount (want /dir/name)", p)}
	}
	if p == "/" {
		return p, nil
	}
	rel, err := CleanRel(strings.TrimSuffix(p[1:], "/"))
	if err != nil {
		return "", err
	}
	return "/" + rel, nil
}

// CleanRel checks a relative path of components as CleanPath does.
func CleanRel(rel string) (string, error) {
	if strings.IndexByte(rel, 0) >= 0 {
		return "", &Error{Errno: syscall.EINVAL, Msg: "path with a NUL byte"}
	}
	for _, c := range strings.Split(rel, "/") {
		switch {
		case c == "" || c == "." || c == "..":
			return "", &Error{Errno: syscall.EINVAL, Msg: fmt.Sprintf("path %q: component %q (no '..', '.' or empty components)", rel, c)}
		case len(c) > 255:
			return "", &Error{Errno: syscall.ENAMETOOLONG, Msg: fmt.Sprintf("path %q: component over 255 bytes", rel)}
		}
	}
	return rel, nil
}

// Range is a byte range inside a tensor, the suffix "@OFFSET" or
// "@OFFSET+LENGTH" of a path (DESIGN.md "In-place copies"), in bytes.
type Range struct {
	// Set: the path has a range; a destination with one is written in
	// place.
	Set bool  `json:"set"`
	Off int64 `json:"off"`
	// Len is the range's length when HasLen; without it a destination
	// takes the source's length and a source runs to its end.
	Len    int64 `json:"len,omitempty"`
	HasLen bool  `json:"has_len,omitempty"`
	// Spans, on a source (Local.Get of a file; Set false), ask for a range
	// list instead of one range: span k's N bytes at Src of the tensor, at
	// Pos of the descriptor's bytes (laid end to end from 0; checkSpans).
	// Their Dst is the puller's business. The in-place lines of one call
	// that pull between one peer tensor and one tensor here travel so, as
	// one get (Pull.Spans).
	Spans []Span `json:"-"`
}

// Dest makes m, a descriptor of a source, one written in place at r in its
// destination: at r.Off, m.NBytes bytes (r's length, when given, must be
// the same). Errors: EINVAL for a length mismatch or a negative offset.
func (r Range) Dest(m Meta) (Meta, error) {
	if r.Off < 0 || r.HasLen && r.Len != m.NBytes {
		return m, &Error{Errno: syscall.EINVAL, Msg: fmt.Sprintf("destination range %s for %d source bytes", r, m.NBytes)}
	}
	m.InPlace, m.Off = true, r.Off
	return m, nil
}

// String is the range as a path suffix ("" when not set).
func (r Range) String() string {
	switch {
	case r.Spans != nil:
		return fmt.Sprintf("@[%d ranges]", len(r.Spans))
	case !r.Set:
		return ""
	case r.HasLen:
		return fmt.Sprintf("@%d+%d", r.Off, r.Len)
	}
	return fmt.Sprintf("@%d", r.Off)
}

// SplitRange splits a range suffix off s: the last "@" followed only by
// OFFSET or OFFSET+LENGTH (decimal, or hex with 0x). A trailing bare "@" is
// dropped and means no range, so a name ending in "@12" is written "x@12@";
// an "@" followed by anything else is part of the name, unless it starts
// like a range (a digit, "-" or "+"). Errors: EINVAL for a range that does
// not fit in an int64, or one that starts like a range and is not one.
func SplitRange(s string) (string, Range, error) {
	i := strings.LastIndexByte(s, '@')
	if i < 0 {
		return s, Range{}, nil
	}
	if i == len(s)-1 {
		return s[:i], Range{}, nil
	}
	offS, lenS, hasLen := strings.Cut(s[i+1:], "+")
	if !isNumber(offS) || hasLen && !isNumber(lenS) {
		if c := s[i+1]; '0' <= c && c <= '9' || c == '-' || c == '+' {
			// It starts like a range ("@12+", "@-1", "@0x"): a typo, not
			// a name to create in place of the tensor it meant.
			return "", Range{}, &Error{Errno: syscall.EINVAL, Msg: fmt.Sprintf("malformed range %q (want @OFFSET or @OFFSET+LENGTH, decimal or 0x hex; a name ending in @... is written with a trailing @)", s[i:])}
		}
		return s, Range{}, nil
	}
	r := Range{Set: true, HasLen: hasLen}
	var err error
	if r.Off, err = parseNumber(offS); err == nil && hasLen {
		r.Len, err = parseNumber(lenS)
	}
	if err != nil || r.HasLen && r.Off > math.MaxInt64-r.Len {
		return "", Range{}, &Error{Errno: syscall.EINVAL, Msg: fmt.Sprintf("range %q does not fit in 63 bits", s[i:])}
	}
	return s[:i], r, nil
}

// parseNumber parses a number isNumber accepted: hex after "0x", else
// decimal, leading zeros included (DESIGN.md: "decimal bytes (0x hex
// accepted)"). Until 2026-12-06 strconv's base 0 read "010" as octal 8
// here, while the range lines' fast parser (namespace's scanNumber) read
// it as 10: one call's bytes went to another place than the same line in
// a longer call. Errors: strconv's (a number past 63 bits).
func parseNumber(s string) (int64, error) {
	if rest, ok := strings.CutPrefix(s, "0x"); ok {
		return strconv.ParseInt(rest, 16, 64)
	}
	return strconv.ParseInt(s, 10, 64)
}

// isNumber reports whether s is a decimal or 0x-hex number with no sign.
// (A loop, not strings.Trim: a batch parses thousands of ranges.)
func isNumber(s string) bool {
	hex := false
	if rest, ok := strings.CutPrefix(s, "0x"); ok {
		s, hex = rest, true
	}
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || hex && ('a' <= c && c <= 'f' || 'A' <= c && c <= 'F')) {
			return false
		}
	}
	return true
}

// ParseRef parses a copy's end, "[NAME:]PATH[@RANGE]": ParsePeerPath on
// what SplitRange leaves. Errors: as theirs.
func ParseRef(s string) (peer, path string, r Range, err error) {
	s = strings.TrimRight(s, "\n")
	rest, r, err := SplitRange(s)
	if err != nil {
		return "", "", Range{}, err
	}
	peer, path, err = ParsePeerPath(rest)
	return peer, path, r, err
}

// Apply makes descs, a source's descriptors, the descriptors of a copy
// whose destination has range r: unchanged without one; one file's written
// in place at r (Dest); a directory's, only with "@0", each written in
// place over the whole same-named tensor, which must hold exactly its bytes
// (the weight update that keeps every importer's mapping). Errors: EINVAL
// for another range on a directory, or what Dest returns.
func (r Range) Apply(descs []Meta, isDir bool) ([]Meta, error) {
	if !r.Set {
		return descs, nil
	}
	out := make([]Meta, len(descs))
	if isDir {
		if r.Off != 0 || r.HasLen {
			return nil, &Error{Errno: syscall.EINVAL, Msg: fmt.Sprintf("a directory's destination range is @0 (each tensor in place), not %s", r)}
		}
		for i, m := range descs {
			m.InPlace, m.Off, m.Exact = true, 0, true
			out[i] = m
		}
		return out, nil
	}
	for i, m := range descs {
		var err error
		if out[i], err = r.Dest(m); err != nil {
			return nil, err
		}
	}
	return out, nil
}
