package tests

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// ownerScript is the process that owns the memory: it creates a memfd of
// argv[1] bytes holding ownerBytes(i) = (i*7+3) % 251, prints "PID FD", and
// answers commands on stdin: "read OFF N" (hex of the bytes, through its own
// mapping), "shrink N" (ftruncate without a seal: its mapping is not touched
// again), "open PATH" (prints the new fd), "close FD", "exit".
const ownerScript = `
import os, sys, mmap
size = int(sys.argv[1])
fd = os.memfd_create("owner", 0)
os.ftruncate(fd, size)
m = mmap.mmap(fd, size)
m[:] = bytes((i * 7 + 3) % 251 for i in range(size))
print(os.getpid(), fd, flush=True)
for line in sys.stdin:
    c = line.split()
    if c[0] == "read":
        off, n = int(c[1]), int(c[2])
        print(m[off:off + n].hex(), flush=True)
    elif c[0] == "shrink":
        os.ftruncate(fd, int(c[1]))
        print("ok", flush=True)
    elif c[0] == "open":
        print(os.open(c[1], os.O_RDONLY), flush=True)
    elif c[0] == "close":
        os.close(int(c[1]))
        print("ok", flush=True)
    elif c[0] == "exit":
        break
`

// ownerBytes is what ownerScript writes at [off, off+n).
func ownerBytes(off, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(((off+i)*7 + 3) % 251)
	}
	return b
}

// owner is a running ownerScript.
type owner struct {
	t     *testing.T
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
	pid   int
	fd    int
	first string // the line the script printed when ready
}

// python3 is the system interpreter (reachable by every uid, unlike a
// pyenv shim under /root).
func python3(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "/usr/local/bin/python3"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is needed to own memfds in these tests")
	}
	return p
}

// startOwner starts ownerScript with a size-byte memfd, as cred when not nil.
func startOwner(t *testing.T, size int, cred *syscall.Credential) *owner {
	t.Helper()
	o := startScript(t, python3(t), ownerScript, []string{strconv.Itoa(size)}, cred)
	_, err := fmt.Sscan(o.first, &o.pid, &o.fd)
	require.NoError(t, err, o.first)
	return o
}

// startScript runs a python script that prints one line when ready (kept in
// first) and then answers commands on stdin, one line each.
func startScript(t *testing.T, py, script string, args []string, cred *syscall.Credential) *owner {
	t.Helper()
	cmd := exec.Command(py, append([]string{"-c", script}, args...)...)
	cmd.Dir = "/"
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	o := &owner{t: t, cmd: cmd, in: in, out: bufio.NewScanner(out)}
	o.out.Buffer(nil, 64<<20)
	t.Cleanup(o.close)
	o.first = o.line()
	return o
}

func (o *owner) line() string {
	o.t.Helper()
	require.True(o.t, o.out.Scan(), "owner process ended: %v", o.out.Err())
	return o.out.Text()
}

func (o *owner) do(cmd string) string {
	o.t.Helper()
	_, err := fmt.Fprintln(o.in, cmd)
	require.NoError(o.t, err)
	return o.line()
}

// read is [off, off+n) of the memfd as its owner sees it.
func (o *owner) read(off, n int) []byte {
	o.t.Helper()
	b, err := hex.DecodeString(o.do(fmt.Sprintf("read %d %d", off, n)))
	require.NoError(o.t, err)
	return b
}

// handle is the register value of the owner's memfd (fd -1: the memfd).
func (o *owner) handle(fd int) string {
	if fd < 0 {
		fd = o.fd
	}
	return fmt.Sprintf("memfd:/proc/%d/fd/%d", o.pid, fd)
}

// close asks the owner to exit and requires a clean exit.
func (o *owner) close() {
	if o.cmd.ProcessState != nil {
		return
	}
	fmt.Fprintln(o.in, "exit")
	o.in.Close()
	require.NoError(o.t, o.cmd.Wait(), "the owner process must exit cleanly")
}

// setErr sets an xattr and returns its error.
func setErr(path, name, val string) func() error {
	return func() error { return unix.Setxattr(path, name, []byte(val), 0) }
}

func mkEmpty(t *testing.T, p string) {
	t.Helper()
	f, err := os.Create(p)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

// TestRegisterMemfd: a memfd another process owns, registered whole and as a
// range, is a tensor: attributes, reads, writes the owner sees, a local copy
// and a peer copy; unlink closes the daemon's fd and leaves the owner's
// memory as it was.
func TestRegisterMemfd(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	d, b := ds["a"], ds["b"]
	const size = 3 * 65536
	o := startOwner(t, size, nil)
	base := d.settledLive()

	whole, part := d.path("whole"), d.path("part")
	mkEmpty(t, whole)
	mkEmpty(t, part)
	setx(t, whole, xattrs.Register, o.handle(-1))
	setx(t, part, xattrs.Register, o.handle(-1)+"@4096+8192")

	require.Equal(t, strconv.Itoa(size), getx(t, whole, xattrs.NBytes))
	require.Equal(t, "U8", getx(t, whole, xattrs.DType))
	require.Equal(t, strconv.Itoa(size), getx(t, whole, xattrs.Shape))
	require.Equal(t, "8192", getx(t, part, xattrs.NBytes))
	require.Equal(t, "4096", getx(t, part, xattrs.IPCOffset))
	require.Equal(t, "0", getx(t, whole, xattrs.IPCOffset))
	require.NotEqual(t, getx(t, whole, xattrs.MRID), getx(t, part, xattrs.MRID))
	require.NotEqual(t, getx(t, whole, xattrs.IPCID), getx(t, part, xattrs.IPCID))
	h := getx(t, whole, xattrs.IPCHandle)
	require.True(t, strings.HasPrefix(h, fmt.Sprintf("memfd:/proc/%d/fd/", d.cmd.Process.Pid)), "the daemon's own fd: %s", h)
	st, err := os.Stat(whole)
	require.NoError(t, err)
	require.EqualValues(t, size, st.Size())
	live := d.stats().Live
	require.EqualValues(t, base.Bytes, live.Bytes, "registered memory is not tensorfs's")
	require.Equal(t, base.Regions+2, live.Regions)

	got, err := os.ReadFile(whole)
	require.NoError(t, err)
	require.Equal(t, ownerBytes(0, size), got)
	got, err = os.ReadFile(part)
	require.NoError(t, err)
	require.Equal(t, ownerBytes(4096, 8192), got)

	f, err := os.OpenFile(part, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("hello"), 10)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("x"), 8192)
	require.ErrorIs(t, err, syscall.EPERM, "a registered tensor cannot grow")
	require.NoError(t, f.Close())
	require.Equal(t, []byte("hello"), o.read(4106, 5), "the owner sees the write")
	require.ErrorIs(t, os.Truncate(part, 100), syscall.EPERM)
	_, err = os.OpenFile(part, os.O_WRONLY|os.O_TRUNC, 0)
	require.ErrorIs(t, err, syscall.EPERM)
	fa, err := os.OpenFile(part, os.O_WRONLY, 0)
	require.NoError(t, err)
	require.ErrorIs(t, unix.Fallocate(int(fa.Fd()), 0, 0, 9000), syscall.EPERM)
	require.NoError(t, fa.Close())
	setx(t, part, xattrs.Shape, "64,128") // a reshape keeping nbytes
	setx(t, part, xattrs.DType, "F32")
	require.Equal(t, "64,32", getx(t, part, xattrs.Shape))
	want := ownerBytes(0, size)
	copy(want[4106:], "hello")

	// A local copy and a peer copy are the daemon's own memory.
	setx(t, whole, xattrs.CopyTo, "/copy")
	got, err = os.ReadFile(d.path("copy"))
	require.NoError(t, err)
	require.Equal(t, want, got)
	setx(t, whole, xattrs.CopyTo, "b:/copy")
	got, err = os.ReadFile(b.path("copy"))
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.NoError(t, os.Remove(b.path("copy")))
	require.NoError(t, os.Remove(d.path("copy")))

	require.NoError(t, os.Remove(whole))
	require.NoError(t, os.Remove(part))
	d.requireClean() // the daemon's fds on the memfd are closed
	b.requireClean()
	require.Equal(t, want, o.read(0, size), "unlink never frees or changes the owner's memory")
	o.close()
}

// TestRegisterBadInput: malformed values, ranges outside the memfd, fds that
// are not memfds (one on this very mount), dead processes and fds, an
// allocated tensor with an open handle: each a clear errno, nothing changed.
func TestRegisterBadInput(t *testing.T) {
	d := startDaemon(t)
	o := startOwner(t, 65536, nil)
	p := d.path("t")
	mkEmpty(t, p)
	base := d.settledLive()
	reg := func(v string) func() error { return setErr(p, xattrs.Register, v) }
	for _, bad := range []string{"", "x", "memfd:", "memfd:/proc/x/fd/3", "memfd:/proc/1/fd/", "memfd:/proc/1/fd/3/", "memfd:/tmp/a",
		"memfd:proc/1/fd/3", "memfd:/proc/-1/fd/3", "memfd:/proc/+1/fd/3", "nvme:1", "cuda:00",
		o.handle(-1) + "@", o.handle(-1) + "@1", o.handle(-1) + "@1+0", o.handle(-1) + "@-1+5", o.handle(-1) + "@a+b", o.handle(-1) + "@1+2+3",
		o.handle(-1) + "@65536+1", o.handle(-1) + "@0+65537", o.handle(-1) + "@60000+6000", o.handle(-1) + "@9223372036854775807+1"} {
		requireErrnoNoChange(t, p, syscall.EINVAL, "register "+bad, reg(bad))
	}
	requireErrnoNoChange(t, p, syscall.EINVAL, "stdin pipe, not a memfd", reg(o.handle(0)))
	other := d.path("other")
	require.NoError(t, os.WriteFile(other, []byte("abc"), 0o644))
	mfd, err := strconv.Atoi(o.do("open " + other))
	require.NoError(t, err)
	requireErrnoNoChange(t, p, syscall.EINVAL, "a file of this mount", reg(o.handle(mfd)))
	require.Equal(t, "ok", o.do(fmt.Sprintf("close %d", mfd)))
	requireErrnoNoChange(t, p, syscall.ENOENT, "a missing fd", reg(o.handle(999)))
	requireErrnoNoChange(t, p, syscall.ENOENT, "a missing pid", reg("memfd:/proc/999999999/fd/3"))
	requireErrnoNoChange(t, d.mnt, syscall.EINVAL, "on a directory", setErr(d.mnt, xattrs.Register, o.handle(-1)))

	// An allocated tensor is replaced only when nothing has it open.
	f, err := os.Open(other)
	require.NoError(t, err)
	requireErrnoNoChange(t, other, syscall.EBUSY, "an open handle", setErr(other, xattrs.Register, o.handle(-1)))
	require.NoError(t, f.Close())
	d.settledLive()
	mr := getx(t, other, xattrs.MRID)
	setx(t, other, xattrs.Register, o.handle(-1)+"@0+16")
	require.Equal(t, "1", getx(t, other, xattrs.Generation))
	require.NotEqual(t, mr, getx(t, other, xattrs.MRID))
	got, err := os.ReadFile(other)
	require.NoError(t, err)
	require.Equal(t, ownerBytes(0, 16), got)
	_, err = getxErr(p, xattrs.Register)
	require.ErrorIs(t, err, syscall.ENODATA, "register is write-only")

	require.NoError(t, os.Remove(other))
	require.NoError(t, os.Remove(p))
	require.EqualValues(t, base.Tensors-1, d.settledLive().Tensors)
	d.requireClean()
}

// TestRegisterPermission: registering is never a way around permissions. A
// caller of another uid naming root's memfd gets EACCES and nothing changes;
// the same caller may register its own uid's memfd.
func TestRegisterPermission(t *testing.T) {
	needOtherUsers(t, "setfattr")
	d := startDaemon(t, "--allow-other")
	openToOthers(d.mnt)
	rootOwner := startOwner(t, 4096, nil)
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
	theirs := startOwner(t, 4096, nobody)
	p := d.path("open")
	mkEmpty(t, p)
	require.NoError(t, os.Chmod(p, 0o666))

	before := snapshot(t, p)
	out, err := asNobody("setfattr", "-n", xattrs.Register, "-v", rootOwner.handle(-1), p)
	require.Error(t, err)
	require.Contains(t, out, "Permission denied")
	require.Equal(t, before, snapshot(t, p), "a refused register changes nothing")

	out, err = asNobody("setfattr", "-n", xattrs.Register, "-v", theirs.handle(-1), p)
	require.NoError(t, err, out)
	require.Equal(t, "4096", getx(t, p, xattrs.NBytes))
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	require.Equal(t, ownerBytes(0, 4096), got)

	// Root may register anything.
	q := d.path("root")
	mkEmpty(t, q)
	setx(t, q, xattrs.Register, theirs.handle(-1)+"@0+100")
	require.NoError(t, os.Remove(p))
	require.NoError(t, os.Remove(q))
	d.requireClean()
}

// TestRegisterShrunk: the owner shrinks its (unsealed) memfd under a
// registered tensor: reads fail with EIO, and the daemon lives on and serves
// other files.
func TestRegisterShrunk(t *testing.T) {
	d := startDaemon(t)
	o := startOwner(t, 65536, nil)
	p := d.path("t")
	mkEmpty(t, p)
	setx(t, p, xattrs.Register, o.handle(-1))
	require.Equal(t, "ok", o.do("shrink 100"))
	_, err := os.ReadFile(p)
	require.ErrorIs(t, err, syscall.EIO)
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("x"), 60000)
	require.ErrorIs(t, err, syscall.EIO)
	require.NoError(t, f.Close())

	q := d.path("other")
	require.NoError(t, os.WriteFile(q, bytes.Repeat([]byte("z"), 5000), 0o644))
	got, err := os.ReadFile(q)
	require.NoError(t, err)
	require.Len(t, got, 5000)
	require.NoError(t, os.Remove(q))
	require.NoError(t, os.Remove(p))
	d.requireClean()
	o.close()
}
