package transfer

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/tensorfs/tensorfs/ipc"
	"golang.org/x/sys/unix"
)

// A memfd handle names a process ("memfd:/proc/PID/fd/N"). An authenticated
// peer of this host may name only its own process's memory: otherwise a
// peer of one cluster could make this daemon read the tensors of another
// cluster's daemon on the same host (another secret) into a destination the
// peer then reads. A unix socket carries the peer's credentials
// (SO_PEERCRED and a pidfd: the process that connected); TCP on loopback
// carries none, so the check finds the socket at the other end of the
// connection in /proc/net/tcp{,6} and requires the named process to hold
// it. Over a unix socket the check is a few syscalls and runs at every
// handle; over TCP it reads /proc and its answer is kept with the process's
// start time, so that a connection whose peer exited (having handed its
// socket on, say) cannot name whatever process gets its pid next
// (checkOwner).

// peerProcess reports whether process pid is the peer of the unix socket
// connection c, or holds the socket at the other end of the local TCP
// connection c, and lives; start is the process's start time for a TCP
// connection's answer to be kept with ("" over a unix socket: not kept).
// Errors: c is neither, or /proc or the credentials cannot be read.
func peerProcess(c net.Conn, pid int) (ok bool, start string, err error) {
	if cc, ok := c.(*closingConn); ok {
		c = cc.Conn
	}
	if uc, ok := c.(*net.UnixConn); ok {
		ok, err := peerCredPID(uc, pid)
		return ok, "", err
	}
	// The start time first: the process it names is the one checked
	// below, and a pid reused after this has another.
	start = processStart(pid)
	if start == "" {
		return false, "", nil
	}
	held, err := holdsPeerSocket(c, pid)
	if err != nil || !held || processStart(pid) != start {
		return false, "", err
	}
	return true, start, nil
}

// processStart is process pid's start time (field 22 of /proc/PID/stat,
// in clock ticks since boot), "" when there is no such process.
func processStart(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return ""
	}
	return f[19] // field 22 is the 20th after the command
}

// holdsPeerSocket reports whether process pid holds the socket at the other
// end of the local TCP connection c. Errors: c is not a TCP connection, or
// /proc cannot be read.
func holdsPeerSocket(c net.Conn, pid int) (bool, error) {
	local, lok := c.LocalAddr().(*net.TCPAddr)
	remote, rok := c.RemoteAddr().(*net.TCPAddr)
	if !lok || !rok {
		return false, fmt.Errorf("not a TCP connection")
	}
	// The peer's socket has our remote address as its local one.
	inode, err := socketInode(remote, local)
	if err != nil {
		return false, err
	}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false, err
	}
	want := "socket:[" + inode + "]"
	for _, e := range ents {
		if t, err := os.Readlink(dir + "/" + e.Name()); err == nil && t == want {
			return true, nil
		}
	}
	return false, nil
}

// peerCredPID reports whether the process at the other end of the unix
// socket c is pid and lives: SO_PEERCRED says which process connected (or
// listened), and its pidfd (SO_PEERPIDFD) whether that very process
// lives; one that connected, handed its socket on and exited would
// otherwise leave its pid to another process, whose memory the check
// would then let a peer name. Errors: the credentials cannot be read, or
// the kernel gives no pidfd (before Linux 6.5: Start then offers no unix
// socket, localSupported).
func peerCredPID(c *net.UnixConn, pid int) (bool, error) {
	cred, err := peerCred(c)
	if err != nil {
		return false, fmt.Errorf("SO_PEERCRED: %w", err)
	}
	if int(cred.Pid) != pid {
		return false, nil
	}
	var pidfd int
	if err := sockopt(c, func(fd int) (err error) {
		pidfd, err = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PEERPIDFD)
		return err
	}); err != nil {
		return false, fmt.Errorf("SO_PEERPIDFD: %w", err)
	}
	defer unix.Close(pidfd)
	// Signal 0 checks without sending: ESRCH once the process exited,
	// whatever its pid names now.
	return unix.PidfdSendSignal(pidfd, 0, nil, 0) == nil, nil
}

// peerCred is the credentials of the process at the other end of the unix
// socket nc (SO_PEERCRED). Errors: nc is no unix socket, or getsockopt's.
func peerCred(nc net.Conn) (*unix.Ucred, error) {
	var cred *unix.Ucred
	err := sockopt(nc, func(fd int) (err error) {
		cred, err = unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
		return err
	})
	return cred, err
}

// sockopt runs get on the fd of the unix socket nc. Errors: nc is no unix
// socket, or get's.
func sockopt(nc net.Conn, get func(fd int) error) error {
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("not a unix socket")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var gerr error
	if err := raw.Control(func(fd uintptr) { gerr = get(int(fd)) }); err != nil {
		return err
	}
	return gerr
}

// localSupported reports whether this kernel gives a unix socket's peer
// as a pidfd (SO_PEERPIDFD, Linux 6.5), which the memfd owner check over
// the socket needs (peerCredPID).
func localSupported() bool {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	pidfd, err := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	if err != nil {
		return false
	}
	unix.Close(pidfd)
	return true
}

// socketInode finds the inode of the TCP socket bound to local and
// connected to remote, in /proc/net/tcp and /proc/net/tcp6.
func socketInode(local, remote *net.TCPAddr) (string, error) {
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		inode, err := findSocket(f, local, remote)
		if err != nil {
			return "", err
		}
		if inode != "" {
			return inode, nil
		}
	}
	return "", fmt.Errorf("no socket %v -> %v in /proc/net/tcp", local, remote)
}

func findSocket(file string, local, remote *net.TCPAddr) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		if os.IsNotExist(err) {
			return "", nil
		}
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			continue
		}
		if procAddrIs(fields[1], local) && procAddrIs(fields[2], remote) {
			return fields[9], nil
		}
	}
	return "", sc.Err()
}

// procAddrIs reports whether a /proc/net/tcp address ("0100007F:1F90": the
// IP as host-order 32-bit words in hex, then the port) is a.
func procAddrIs(s string, a *net.TCPAddr) bool {
	ipHex, portHex, ok := strings.Cut(s, ":")
	if !ok {
		return false
	}
	port, err := strconv.ParseUint(portHex, 16, 16)
	if err != nil || int(port) != a.Port {
		return false
	}
	raw, err := hex.DecodeString(ipHex)
	if err != nil || len(raw)%4 != 0 {
		return false
	}
	ip := make(net.IP, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.BigEndian.PutUint32(ip[i:], binary.NativeEndian.Uint32(raw[i:]))
	}
	return ip.Equal(a.IP)
}

// handlePID is the PID a memfd handle names, or 0.
func handlePID(handle string) int {
	h, err := ipc.ParseHandle(handle)
	if err != nil || h.Kind != ipc.KindMemfd {
		return 0
	}
	return h.PID
}
