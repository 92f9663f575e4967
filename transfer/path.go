package transfer

import (
	"fmt"
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
