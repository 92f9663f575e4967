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
	if c == nil || c.UID == 0 {
		return nil
	}
	uid, gid := f.meta.Owner()
	f.meta.Lock()
	mode := f.meta.Mode
	f.meta.Unlock()
	var bit uint32
	switch {
	case c.UID == uid:
		bit = 0o200
	case c.GID == gid || inGroup(c.PID, gid):
		bit = 0o020
	default:
		bit = 0o002
	}
	if mode&bit == 0 {
		return errf(syscall.EACCES, "uid %d may not write the in-place destination (mode %04o, owner %d:%d)", c.UID, mode, uid, gid)
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
