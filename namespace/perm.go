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
	return mayAccess(c, f, 0o2, "write the in-place destination")
}

// mayRead checks that caller c may read file f, a copy's source in this
// mount, as open(O_RDONLY) would (mayWrite's rules, with the read bits):
// without it, a copy into a file of the caller's own, or to a peer, read a
// tensor whose mode kept the caller out. Errors: EACCES.
func mayRead(c *Caller, f *File) error { return mayAccess(c, f, 0o4, "read the source") }

// mayAccess checks caller c's access to f for bit (0o4 read, 0o2 write) of
// the owner's, group's or others' class; what names the access in the
// error. Errors: EACCES.
func mayAccess(c *Caller, f *File, bit uint32, what string) error {
	if c == nil || c.UID == 0 {
		return nil
	}
	uid, gid := f.meta.Owner()
	f.meta.Lock()
	mode := f.meta.Mode
	f.meta.Unlock()
	switch {
	case c.UID == uid:
		bit <<= 6
	case c.GID == gid || inGroup(c.PID, gid):
		bit <<= 3
	}
	if mode&bit == 0 {
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
