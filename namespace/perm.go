package namespace

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// mayWrite checks that caller c may write file f, as open(O_WRONLY) would
// under default_permissions: root may; else the owner's, group's (the
// caller's gid or one of its supplementary groups, read from
// /proc/TID/status: FUSE names only the primary gid) or others' write bit.
// A nil caller is a peer's copy (the cluster secret authorizes it).
// Errors: EACCES.
func mayWrite(c *Caller, f *File) error {
	return mayAccess(c, &f.meta, 0o2, "write the in-place destination")
}

// mayRead checks that caller c may read file f, a copy's source in this
// mount, as open(O_RDONLY) would (mayWrite's rules, with the read bits):
// without it, a copy into a file of the caller's own, or to a peer, read a
// tensor whose mode kept the caller out. Errors: EACCES.
func mayRead(c *Caller, f *File) error { return mayAccess(c, &f.meta, 0o4, "read the source") }

// mayEnter checks that caller c may create or replace entry name of
// directory d, as creat(2) and rename(2) ask: write and search permission
// on d, and, when d is sticky (mode 01000, /tmp's) and name exists, that c
// owns d or the entry. Errors: EACCES.
func mayEnter(c *Caller, d *Dir, name string) error {
	if err := mayAccess(c, &d.meta, 0o3, "create or replace entries in the destination directory"); err != nil || c == nil || c.UID == 0 {
		return err
	}
	d.meta.Lock()
	sticky := d.meta.Mode&01000 != 0
	d.meta.Unlock()
	old := d.Child(name)
	if !sticky || old == nil {
		return nil
	}
	dirUID, _ := d.meta.Owner()
	oldUID, _ := old.Meta().Owner()
	if c.UID != dirUID && c.UID != oldUID {
		return errf(syscall.EACCES, "uid %d may not replace %s in a sticky directory (owner %d, the directory's %d)", c.UID, name, oldUID, dirUID)
	}
	return nil
}

// mayReach checks that caller c may search every directory on the way to
// the node at p (cleaned, mount-relative), as a path lookup would: the
// root and each directory before p's last component. A missing component
// or a file on the way passes: the lookup that follows says so.
// Errors: EACCES.
func (t *Tree) mayReach(c *Caller, p string) error {
	if c == nil || c.UID == 0 {
		return nil
	}
	d := t.root
	for rest := strings.TrimPrefix(p, "/"); ; {
		if err := mayAccess(c, &d.meta, 0o1, "search a directory on the path to "+p); err != nil {
			return err
		}
		name, after, more := strings.Cut(rest, "/")
		if !more {
			return nil
		}
		sub, ok := d.Child(name).(*Dir)
		if !ok {
			return nil
		}
		d, rest = sub, after
	}
}

// mayList checks that caller c may list and search d and every directory
// below it (read and search permission), as a copy of the tree reads
// them. Errors: EACCES.
func (d *Dir) mayList(c *Caller) error {
	if c == nil || c.UID == 0 {
		return nil
	}
	if err := mayAccess(c, &d.meta, 0o5, "list a directory of the source tree"); err != nil {
		return err
	}
	for _, e := range d.Entries() {
		if sub, ok := e.Node.(*Dir); ok {
			if err := sub.mayList(c); err != nil {
				return err
			}
		}
	}
	return nil
}

// mayAccess checks caller c's access to a node of metadata m for bits
// (0o4 read, 0o2 write, 0o1 search, or several) of the owner's, group's
// or others' class; what names the access in the error. Errors: EACCES.
func mayAccess(c *Caller, m *Meta, bits uint32, what string) error {
	if c == nil || c.UID == 0 {
		return nil
	}
	uid, gid := m.Owner()
	m.Lock()
	mode := m.Mode
	m.Unlock()
	switch {
	case c.UID == uid:
		bits <<= 6
	case c.GID == gid || inGroup(c.PID, gid):
		bits <<= 3
	}
	if mode&bits != bits {
		return errf(syscall.EACCES, "uid %d may not %s (mode %04o, owner %d:%d)", c.UID, what, mode, uid, gid)
	}
	return nil
}

// inGroup reports whether thread tid has gid among its supplementary
// groups; false when that cannot be read (the thread is gone).
func inGroup(tid uint32, gid uint32) bool {
	if tid == 0 {
		return false
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "Groups:")
		if !ok {
			continue
		}
		for _, g := range strings.Fields(rest) {
			if v, err := strconv.ParseUint(g, 10, 32); err == nil && uint32(v) == gid {
				return true
			}
		}
		return false
	}
	return false
}

type copyCallerKey struct{}

// callerOf is the caller a copy's context carries (CopyContext), or nil.
func callerOf(ctx context.Context) *Caller {
	c, _ := ctx.Value(copyCallerKey{}).(*Caller)
	return c
}
