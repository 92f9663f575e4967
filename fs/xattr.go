package fs

import (
	"context"
	"encoding/hex"
	"strconv"
	"strings"
	"syscall"

	"github.com/tensorfs/tensorfs/xattrs"
)

// maxUserXattr is the largest value of an ordinary user.* attribute, in bytes
// (Linux's XATTR_SIZE_MAX).
const maxUserXattr = 64 << 10

// Flags of setxattr(2), from linux/xattr.h.
const (
	xattrCreate  = 1
	xattrReplace = 2
)

// fileAttrs are the readable tensorfs attributes of a tensor file (full
// names), in listing order.
var fileAttrs = []string{xattrs.DType, xattrs.Shape, xattrs.Device, xattrs.NBytes, xattrs.Generation,
	xattrs.MRID, xattrs.IPCID, xattrs.IPCHandle, xattrs.IPCOffset, xattrs.RKey}

// dirAttrs are the readable tensorfs attributes of a directory (full names),
// in listing order.
var dirAttrs = []string{xattrs.DType, xattrs.Shape, xattrs.Device, xattrs.StatsName}

// knownAttr are the settable attributes (full names), for refusals that
// tell an attribute a node does not take from a misspelled one.
var knownAttr = func() map[string]bool {
	m := map[string]bool{}
	for _, a := range xattrs.Settable {
		m[a] = true
	}
	return m
}()

// readOnly are attributes (full names) that can be read but never set (EPERM).
var readOnly = map[string]bool{xattrs.MRID: true, xattrs.IPCID: true, xattrs.IPCHandle: true, xattrs.IPCOffset: true, xattrs.RKey: true,
	xattrs.NBytes: true, xattrs.Generation: true, xattrs.StatsName: true}

// xattrReply answers a getxattr/listxattr: a size-0 probe or a short buffer
// gets (length, ERANGE), which go-fuse turns into the length for probes.
func xattrReply(dest, val []byte) (uint32, syscall.Errno) {
	if len(dest) < len(val) {
		return uint32(len(val)), syscall.ERANGE
	}
	return uint32(copy(dest, val)), 0
}

// fileAttr returns a tensor file's tensorfs attribute (by full name), or
// ENODATA when it does not exist (yet).
func (f *File) fileAttr(attr string) (string, syscall.Errno) {
	in := f.t.Info()
	switch attr {
	case xattrs.DType:
		if in.DType != "" {
			return string(in.DType), 0
		}
	case xattrs.Shape:
		if in.Shape != nil {
			return in.Shape.String(), 0
		}
	case xattrs.Device:
		return in.Device, 0
	case xattrs.NBytes:
		return strconv.FormatInt(in.Size, 10), 0
	case xattrs.Generation:
		return strconv.FormatUint(in.Generation, 10), 0
	case xattrs.MRID:
		if in.Allocated {
			return strconv.FormatUint(in.MRID, 10), 0
		}
	case xattrs.IPCID:
		if in.Allocated {
			return strconv.FormatUint(in.IPCID, 10), 0
		}
	case xattrs.IPCHandle:
		if in.Allocated {
			return in.IPCHandle, 0
		}
	case xattrs.IPCOffset:
		if in.Allocated {
			return strconv.FormatInt(in.IPCOffset, 10), 0
		}
	case xattrs.RKey:
		if len(in.Rkey) > 0 {
			return hex.EncodeToString(in.Rkey), 0
		}
	}
	return "", syscall.ENODATA
}

// Getxattr implements gofs.NodeGetxattrer. The kernel has checked read
// permission on the file (so ipc_handle, a capability, needs it).
func (f *File) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if !strings.HasPrefix(attr, xattrs.Prefix) {
		return f.meta.getUser(attr, dest)
	}
	v, errno := f.fileAttr(attr)
	if errno != 0 {
		return 0, errno
	}
	return xattrReply(dest, []byte(v))
}

// Setxattr implements gofs.NodeSetxattrer. A tensorfs attribute's refusal
// is logged and kept for stats with its reason (refuse).
func (f *File) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if !strings.HasPrefix(attr, xattrs.Prefix) {
		return f.meta.setUser(attr, data, flags)
	}
	return f.fsys.refuse(ctx, f.ns, attr, f.setxattr(ctx, attr, data))
}

// setxattr sets tensorfs attribute attr (its full name) to data, which the
// actions borrow (the request's buffer) and the rest copy.
func (f *File) setxattr(ctx context.Context, attr string, data []byte) error {
	var err error
	switch attr {
	case xattrs.DType:
		err = f.t.SetDType(string(data))
	case xattrs.Shape:
		err = f.t.SetShape(string(data))
	case xattrs.Device:
		err = f.t.SetDevice(string(data))
	case xattrs.CopyTo:
		return f.fsys.tree.CopyTo(copyCtx(ctx), f.ns, data, true)
	case xattrs.CopyFrom:
		return f.fsys.tree.CopyFrom(copyCtx(ctx), f.ns, data)
	case xattrs.Register:
		err = f.fsys.tree.Register(caller(ctx), f.t, string(data))
	default:
		return readOnlyOrInvalid(attr, "a file")
	}
	if err == nil {
		f.ns.Touched()
	}
	return err
}

// readOnlyOrInvalid is the refusal of a set of a tensorfs attribute that
// the node's Setxattr does not handle: EPERM for a read-only one, else
// EINVAL (an unknown name, or an action this kind of node, what, does not
// take: batch on a file or below the root, register on a directory).
func readOnlyOrInvalid(attr, what string) error {
	if readOnly[attr] {
		return errnoErr(syscall.EPERM, "%s is read-only", attr)
	}
	if knownAttr[attr] {
		return errnoErr(syscall.EINVAL, "%s is not taken by %s", attr, what)
	}
	return errnoErr(syscall.EINVAL, "unknown attribute %s (the attributes are %s)", attr, strings.Join(xattrs.Settable, ", "))
}

// Listxattr implements gofs.NodeListxattrer: the readable attributes that
// exist now, then the ordinary user ones.
func (f *File) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	var b []byte
	for _, n := range fileAttrs {
		if _, errno := f.fileAttr(n); errno == 0 {
			b = append(append(b, n...), 0)
		}
	}
	return xattrReply(dest, f.meta.listUser(b))
}

// Removexattr implements gofs.NodeRemovexattrer: tensorfs attributes of a file
// cannot be removed (EPERM).
func (f *File) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if strings.HasPrefix(attr, xattrs.Prefix) {
		return f.fsys.refuse(ctx, f.ns, attr, errnoErr(syscall.EPERM, "a file's tensorfs attributes cannot be removed"))
	}
	return f.meta.removeUser(attr)
}

// dirAttr returns a directory's tensorfs attribute (by full name) or ENODATA.
func (d *Dir) dirAttr(attr string) ([]byte, syscall.Errno) {
	t := d.d.Template()
	switch attr {
	case xattrs.DType:
		if t.DType != "" {
			return []byte(t.DType), 0
		}
	case xattrs.Shape:
		if t.Shape != nil {
			return []byte(t.Shape.String()), 0
		}
	case xattrs.Device:
		if t.Device != "" {
			return []byte(t.Device), 0
		}
	case xattrs.StatsName:
		if d.isRoot() {
			return d.fsys.tree.StatsJSON(), 0
		}
	}
	return nil, syscall.ENODATA
}

// Getxattr implements gofs.NodeGetxattrer.
func (d *Dir) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if !strings.HasPrefix(attr, xattrs.Prefix) {
		return d.meta.getUser(attr, dest)
	}
	v, errno := d.dirAttr(attr)
	if errno != 0 {
		return 0, errno
	}
	return xattrReply(dest, v)
}

// Setxattr implements gofs.NodeSetxattrer: dtype, shape and device set the
// template (validated together, so a bad value changes nothing).
func (d *Dir) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if !strings.HasPrefix(attr, xattrs.Prefix) {
		return d.meta.setUser(attr, data, flags)
	}
	return d.fsys.refuse(ctx, d.d, attr, d.setxattr(ctx, attr, data))
}

// setxattr sets tensorfs attribute attr (its full name) of the directory
// to data, which the actions borrow (the request's buffer).
func (d *Dir) setxattr(ctx context.Context, attr string, data []byte) error {
	switch {
	case attr == xattrs.CopyTo:
		return d.fsys.tree.CopyTo(copyCtx(ctx), d.d, data, true)
	case attr == xattrs.CopyFrom:
		return d.fsys.tree.CopyFrom(copyCtx(ctx), d.d, data)
	case attr == xattrs.Batch && d.isRoot():
		return d.fsys.tree.Batch(copyCtx(ctx), data)
	case attr == xattrs.DType || attr == xattrs.Shape || attr == xattrs.Device:
		// The namespace takes the template attribute's short name.
		return d.d.SetTemplateAttr(strings.TrimPrefix(attr, xattrs.Prefix), string(data))
	case attr == xattrs.Batch:
		return errnoErr(syscall.EINVAL, "%s is taken by the root directory only", attr)
	}
	return readOnlyOrInvalid(attr, "a directory")
}

// Listxattr implements gofs.NodeListxattrer.
func (d *Dir) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	var b []byte
	for _, n := range dirAttrs {
		if _, errno := d.dirAttr(n); errno == 0 {
			b = append(append(b, n...), 0)
		}
	}
	return xattrReply(dest, d.meta.listUser(b))
}

// Removexattr implements gofs.NodeRemovexattrer: a directory's template
// attributes can be removed; other tensorfs attributes cannot (EPERM).
func (d *Dir) Removexattr(ctx context.Context, attr string) syscall.Errno {
	name, ok := strings.CutPrefix(attr, xattrs.Prefix)
	if !ok {
		return d.meta.removeUser(attr)
	}
	// The namespace takes the template attribute's short name.
	return d.fsys.refuse(ctx, d.d, attr, d.d.RemoveTemplateAttr(name))
}

// getUser reads an ordinary attribute. Other namespaces (security., trusted.,
// system.) hold nothing here: ENODATA.
func (m meta) getUser(attr string, dest []byte) (uint32, syscall.Errno) {
	m.Lock()
	v, ok := m.Xattrs[attr]
	m.Unlock()
	if !ok {
		return 0, syscall.ENODATA
	}
	return xattrReply(dest, v)
}

// setUser stores an ordinary user.* attribute, honouring XATTR_CREATE and
// XATTR_REPLACE; other namespaces are EOPNOTSUPP.
func (m meta) setUser(attr string, data []byte, flags uint32) syscall.Errno {
	if !strings.HasPrefix(attr, "user.") {
		return syscall.EOPNOTSUPP
	}
	if len(data) > maxUserXattr {
		return syscall.E2BIG
	}
	m.Lock()
	defer m.Unlock()
	_, exists := m.Xattrs[attr]
	if flags&xattrCreate != 0 && exists {
		return syscall.EEXIST
	}
	if flags&xattrReplace != 0 && !exists {
		return syscall.ENODATA
	}
	if m.Xattrs == nil {
		m.Xattrs = map[string][]byte{}
	}
	m.Xattrs[attr] = append([]byte(nil), data...)
	return 0
}

// removeUser removes an ordinary attribute; ENODATA when it is not set.
func (m meta) removeUser(attr string) syscall.Errno {
	m.Lock()
	defer m.Unlock()
	if _, ok := m.Xattrs[attr]; !ok {
		return syscall.ENODATA
	}
	delete(m.Xattrs, attr)
	return 0
}

// listUser appends the ordinary attribute names, NUL-terminated, to b.
func (m meta) listUser(b []byte) []byte {
	m.Lock()
	defer m.Unlock()
	for n := range m.Xattrs {
		b = append(append(b, n...), 0)
	}
	return b
}
