package namespace

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/gpu"
	"github.com/tensorfs/tensorfs/ipc"
	"github.com/tensorfs/tensorfs/tensor"
)

// Caller is the process a request comes from, as FUSE names it: the
// calling thread's id and its uid and gid.
type Caller struct {
	UID, GID uint32
	// PID is the calling thread's id (FUSE's pid).
	PID uint32
}

// parseRegistration parses a register value, HANDLE[@OFFSET+LENGTH], with
// the one handle parser (ipc.ParseSpec). Errors: syscall.EINVAL, wrapping
// what is wrong.
func parseRegistration(v string) (ipc.Spec, error) {
	sp, err := ipc.ParseSpec(v)
	if err != nil {
		return sp, fmt.Errorf("register: %v: %w", err, syscall.EINVAL)
	}
	return sp, nil
}

// Register implements the register action on t: it imports the memory the
// value names and makes it f's tensor. A memfd is opened only once the
// requester's right to it is checked (see openMemfd); a CUDA IPC handle is a
// capability (whoever holds it may map the allocation) and cannot be checked.
//
// It makes no syscall on the mount: /proc only, and the memfd's fd is read
// with readlink (which does not touch the file it names) before anything is
// opened, so an fd naming a file of this mount is refused, not opened.
//
// c is the caller, nil when unknown (then a memfd is EACCES). Errors:
// syscall.EINVAL for a malformed value, EACCES, ENOENT (see openMemfd), and
// the store's and tensor's import errors.
func (f *Tree) Register(c *Caller, t *tensor.Tensor, v string) error {
	r, err := parseRegistration(v)
	if err != nil {
		return err
	}
	var buf gpu.Buffer
	if r.Kind == ipc.KindMemfd {
		if c == nil {
			return fmt.Errorf("register %s: no caller: %w", r.Handle, syscall.EACCES)
		}
		file, err := openMemfd(c, r.PID, r.FD)
		if err != nil {
			return err
		}
		buf, err = f.store.ImportFile(file, r.Off, r.Len)
		file.Close()
		if err != nil {
			return err
		}
	} else {
		if buf, err = f.store.Import(r.Handle.String(), r.Off, r.Len); err != nil {
			return err
		}
	}
	return t.Register(buf)
}

// openMemfd opens fd n of process pid for the FUSE caller c, if c may use it:
// c is root, or pid is c's own thread group, or pid's real, effective and
// saved uids and gids are c's and pid is dumpable (its /proc entry is owned
// by that uid) - the kernel's ptrace read rule, so registering gives a caller
// nothing it could not open itself. FUSE names the calling thread, so its
// thread group is resolved from /proc/TID/status. Everything is read through
// one open /proc/PID directory, so the process checked is the one whose fd
// is opened (a pid reused meanwhile fails with ESRCH). Errors: EACCES,
// ENOENT (no such process or fd), EINVAL (not a memfd).
func openMemfd(c *Caller, pid, n int) (*os.File, error) {
	dir, err := unix.Open(fmt.Sprintf("/proc/%d", pid), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("register: process %d: %w", pid, err)
	}
	defer unix.Close(dir)
	if c.UID != 0 {
		tgid, _, err := procStatus(unix.AT_FDCWD, fmt.Sprintf("/proc/%d/status", c.PID))
		if err != nil || tgid != pid {
			if err := sameCreds(dir, c); err != nil {
				return nil, fmt.Errorf("register: caller pid %d uid %d on process %d: %w", c.PID, c.UID, pid, err)
			}
		}
	}
	link := fmt.Sprintf("fd/%d", n)
	buf := make([]byte, 256)
	m, err := unix.Readlinkat(dir, link, buf)
	if err != nil {
		return nil, fmt.Errorf("register: /proc/%d/%s: %w", pid, link, err)
	}
	if target := string(buf[:m]); !strings.HasPrefix(target, "/memfd:") {
		return nil, fmt.Errorf("register: /proc/%d/%s is %q, not a memfd: %w", pid, link, target, syscall.EINVAL)
	}
	fd, err := unix.Openat(dir, link, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("register: open /proc/%d/%s: %w", pid, link, err)
	}
	// Host.ImportFile checks again on what was opened (the fd may have
	// been replaced between the readlink and the open).
	return os.NewFile(uintptr(fd), fmt.Sprintf("/proc/%d/%s", pid, link)), nil
}

// sameCreds checks that the process of /proc directory dir runs entirely as
// c (real, effective and saved uid and gid) and is dumpable. Errors: EACCES.
func sameCreds(dir int, c *Caller) error {
	var st unix.Stat_t
	if err := unix.Fstat(dir, &st); err != nil {
		return err
	}
	// /proc/PID of a non-dumpable process (setuid, or prctl) is owned by root.
	if st.Uid != c.UID {
		return fmt.Errorf("process owned by uid %d: %w", st.Uid, syscall.EACCES)
	}
	_, ids, err := procStatus(dir, "status")
	if err != nil {
		return err
	}
	for _, u := range ids.uids {
		if u != c.UID {
			return fmt.Errorf("process uids %v: %w", ids.uids, syscall.EACCES)
		}
	}
	for _, g := range ids.gids {
		if g != c.GID {
			return fmt.Errorf("process gids %v: %w", ids.gids, syscall.EACCES)
		}
	}
	return nil
}

// creds are the real, effective and saved ids of a process's status file.
type creds struct{ uids, gids []uint32 }

// procStatus reads Tgid and the Uid/Gid lines of a /proc status file, opened
// at path relative to dir.
func procStatus(dir int, path string) (tgid int, c creds, err error) {
	fd, err := unix.Openat(dir, path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, c, err
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	ids := func(fields []string) []uint32 {
		var out []uint32
		for _, s := range fields[1:min(4, len(fields))] { // real, effective, saved
			v, err := strconv.ParseUint(s, 10, 32)
			if err != nil {
				return nil
			}
			out = append(out, uint32(v))
		}
		return out
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		switch fields[0] {
		case "Tgid:":
			tgid, _ = strconv.Atoi(fields[1])
		case "Uid:":
			c.uids = ids(fields)
		case "Gid:":
			c.gids = ids(fields)
		}
	}
	if tgid == 0 || len(c.uids) != 3 || len(c.gids) != 3 {
		return 0, c, fmt.Errorf("%s: no Tgid, Uid or Gid line: %w", path, syscall.EACCES)
	}
	return tgid, c, sc.Err()
}
