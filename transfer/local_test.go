package transfer

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// pooledKind is the network of the idle connections cli keeps to peer
// ("tcp", "unix"), all of one kind, or "" when none or mixed.
func pooledKind(cli *Service, peer string) string {
	cli.mu.Lock()
	defer cli.mu.Unlock()
	kind := ""
	for _, ic := range cli.idle[peer] {
		k := ic.c.c.LocalAddr().Network()
		if kind != "" && k != kind {
			return ""
		}
		kind = k
	}
	return kind
}

// TestSameHostPeersUseUnixSocket: a peer of the same host id is reached on
// its abstract unix socket after the first TCP handshake, and the pool
// keeps those connections (stats name the socket); a restarted peer's old
// socket is gone, and the next copy finds the new one through TCP; a peer
// of another host id stays on TCP.
func TestSameHostPeersUseUnixSocket(t *testing.T) {
	same := func(c *Config) { c.HostID = "one-host" }
	b := newMemLocal()
	srv := startServer(t, "b", b, testSecret, same)
	require.True(t, strings.HasPrefix(srv.localName, localPrefix), "listening on %q", srv.localName)
	a := newMemLocal()
	a.put("/x", []byte("payload"))
	cli := newClient(t, "a", a, testSecret, map[string]string{"b": addrOf(srv)}, same)
	for i := range 10 {
		_, err := push(context.Background(), cli, a, "/x", "b", fmt.Sprintf("/y%d", i))
		require.NoError(t, err)
		requireSameTensor(t, a, "/x", b, fmt.Sprintf("/y%d", i))
	}
	require.Equal(t, "unix", pooledKind(cli, "b"))
	require.Equal(t, srv.localName, cli.Stats().Peers["b"].Local)
	require.Eventually(t, func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.conns) == 1 // the first TCP connection was closed
	}, 5*time.Second, time.Millisecond)

	// A restart: the same TCP address, a new instance and socket.
	addr, old := addrOf(srv), srv.localName
	srv.Close()
	srv2 := startServer(t, "b", b, testSecret, func(c *Config) { same(c); c.Listen = addr })
	require.NotEqual(t, old, srv2.localName)
	cli.mu.Lock()
	for _, ic := range cli.idle["b"] {
		ic.c.c.Close() // as the reaper would find it; the dial is what is tested
	}
	cli.idle["b"] = nil
	cli.mu.Unlock()
	_, err := push(context.Background(), cli, a, "/x", "b", "/z")
	require.NoError(t, err)
	require.Equal(t, "unix", pooledKind(cli, "b"))
	require.Equal(t, srv2.localName, cli.Stats().Peers["b"].Local)

	// Another host id: TCP, and no socket in stats.
	c := newMemLocal()
	srv3 := startServer(t, "c", c, testSecret, nil)
	cli3 := newClient(t, "a", a, testSecret, map[string]string{"c": addrOf(srv3)}, nil)
	for range 3 {
		_, err := push(context.Background(), cli3, a, "/x", "c", "/y")
		require.NoError(t, err)
	}
	require.Equal(t, "tcp", pooledKind(cli3, "c"))
	require.Empty(t, cli3.Stats().Peers["c"].Local)
	requireClean(t, b)
	requireClean(t, c)
}

// TestLocalSocketFromDialledHandshakeOnly: a node that connects in under a
// peer's name (a second daemon of the same --name, or anyone with the
// secret) does not change where copies to that name go: only the
// handshake this node dials to the peer's address says which unix socket
// is the peer's.
func TestLocalSocketFromDialledHandshakeOnly(t *testing.T) {
	same := func(c *Config) { c.HostID = "one-host" }
	a, b, c := newMemLocal(), newMemLocal(), newMemLocal()
	a.put("/q", []byte("for the real b"))
	c.put("/cx", []byte("from the impostor"))
	srvB := startServer(t, "b", b, testSecret, same)
	srvA := startServer(t, "a", a, testSecret, func(cfg *Config) { same(cfg); cfg.Peers = map[string]string{"b": addrOf(srvB)} })
	imp := startServer(t, "b", c, testSecret, func(cfg *Config) { same(cfg); cfg.Peers = map[string]string{"a": addrOf(srvA)} })
	// The impostor pushes to a: a accepts a connection from "b".
	_, err := push(context.Background(), imp, c, "/cx", "a", "/from-c")
	require.NoError(t, err)
	_, err = push(context.Background(), srvA, a, "/q", "b", "/q1")
	require.NoError(t, err)
	requireSameTensor(t, a, "/q", b, "/q1")
	_, _, onImpostor := c.get("/q1")
	require.False(t, onImpostor, "the copy went to the impostor")
	require.Equal(t, srvB.localName, srvA.Stats().Peers["b"].Local)
	require.Equal(t, "unix", pooledKind(srvA, "b"))
}

// TestLocalSocketSquatted: a process other than the peer that holds the
// peer's unix socket name (a restarted peer's old name, taken by any local
// user) is passed over at once: the listener's process (SO_PEERCRED) is
// not the one the TCP handshake named, so nothing is sent to it, and the
// copy goes over TCP without waiting for the squatter, which sends
// keepalives and would otherwise hold the handshake.
func TestLocalSocketSquatted(t *testing.T) {
	py, err := exec.LookPath("python3")
	require.NoError(t, err, "python3 runs the squatter")
	same := func(c *Config) { c.HostID = "one-host"; c.Timeout = 5 * time.Second }
	b := newMemLocal()
	srv := startServer(t, "b", b, testSecret, same)
	a := newMemLocal()
	a.put("/x", []byte("payload"))
	cli := newClient(t, "a", a, testSecret, map[string]string{"b": addrOf(srv)}, same)
	_, err = push(context.Background(), cli, a, "/x", "b", "/y0")
	require.NoError(t, err)
	old := srv.localName
	addr := addrOf(srv)
	srv.Close()
	// The squatter binds the old name and answers every connection with a
	// keepalive frame a second.
	sq := exec.Command(py, "-c", `
import socket, struct, sys, threading, time
l = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
l.bind("\0" + sys.argv[1][1:]); l.listen(8)
print("up", flush=True)
def serve(s):
    try:
        while True:
            s.sendall(struct.pack(">I", 1) + bytes([9])); time.sleep(0.2)
    except Exception:
        pass
while True:
    s, _ = l.accept(); threading.Thread(target=serve, args=(s,), daemon=True).start()
`, old)
	out, err := sq.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, sq.Start())
	t.Cleanup(func() { sq.Process.Kill(); sq.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n') // print may write "up" and "\n" apart (PYTHONUNBUFFERED)
	require.NoError(t, err)
	require.Equal(t, "up\n", line)
	srv2 := startServer(t, "b", b, testSecret, func(c *Config) { same(c); c.Listen = addr })
	cli.mu.Lock()
	for _, ic := range cli.idle["b"] {
		ic.c.c.Close()
	}
	cli.idle["b"] = nil
	cli.mu.Unlock()
	start := time.Now()
	_, err = push(context.Background(), cli, a, "/x", "b", "/y1")
	require.NoError(t, err)
	require.Less(t, time.Since(start), 2*time.Second, "the squatter held the copy")
	requireSameTensor(t, a, "/x", b, "/y1")
	require.Equal(t, srv2.localName, cli.Stats().Peers["b"].Local)
	require.Equal(t, "unix", pooledKind(cli, "b"))
}

// TestHandshakeBounded: a peer that answers a hello with keepalives only
// fails the dial within the timeout (keepalives do not extend a
// handshake), as one that says nothing does.
func TestHandshakeBounded(t *testing.T) {
	for _, mode := range []string{"keepalives", "silent"} {
		addr := rawServer(t, func(nc net.Conn) {
			c := wrapConn(nc, "raw")
			if _, _, err := c.recv(); err != nil {
				return
			}
			for mode == "keepalives" {
				if c.send(frameKeepalive, nil) != nil || c.flush() != nil {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(3 * time.Second)
		})
		cli := newClient(t, "a", newMemLocal(), testSecret, map[string]string{"raw": addr}, func(c *Config) { c.Timeout = 300 * time.Millisecond })
		start := time.Now()
		_, err := cli.dial(context.Background(), "raw")
		require.Error(t, err, mode)
		require.Less(t, time.Since(start), 2*time.Second, "%s: the handshake outlived its timeout", mode)
	}
}

// TestPeerCredPID: the memfd owner check over a unix socket names the
// process that connected only while it lives: one that connected and
// exited (its pid free for another process) is no peer, as one with
// another pid is not.
func TestPeerCredPID(t *testing.T) {
	py, err := exec.LookPath("python3")
	require.NoError(t, err)
	if !localSupported() {
		t.Skip("this kernel gives no SO_PEERPIDFD (Linux 6.5): nodes offer no unix socket")
	}
	name := fmt.Sprintf("@tensorfs-test-peercred-%d", os.Getpid())
	ln, err := net.Listen("unix", name)
	require.NoError(t, err)
	defer ln.Close()
	// A live process that connects and waits for its stdin to close.
	live := exec.Command(py, "-c", `
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect("\0" + sys.argv[1][1:])
sys.stdin.read()
`, name)
	in, err := live.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, live.Start())
	nc, err := ln.Accept()
	require.NoError(t, err)
	defer nc.Close()
	uc := nc.(*net.UnixConn)
	ok, err := peerCredPID(uc, live.Process.Pid)
	require.NoError(t, err)
	require.True(t, ok, "the live process that connected")
	ok, err = peerCredPID(uc, os.Getpid())
	require.NoError(t, err)
	require.False(t, ok, "another process")
	in.Close()
	require.NoError(t, live.Wait())
	ok, err = peerCredPID(uc, live.Process.Pid)
	require.NoError(t, err)
	require.False(t, ok, "the process that connected has exited: its pid may be another's now")
	label := remoteLabel(uc)
	require.True(t, strings.HasPrefix(label, "unix socket (pid "), label)
}

// TestOwnerCheckEndsWithThePeer: a connection whose peer process passed it
// on and exited cannot go on naming that process's memfds: the first put,
// while it lives, passes the owner check; the same handle after it exited
// (its pid free for another process) is EXDEV, not the check's earlier
// answer. Over the unix socket and over TCP.
func TestOwnerCheckEndsWithThePeer(t *testing.T) {
	py, err := exec.LookPath("python3")
	require.NoError(t, err)
	for _, network := range []string{"unix", "tcp"} {
		t.Run(network, func(t *testing.T) {
			local := newMemLocal()
			srv := startServer(t, "srv", local, testSecret, func(c *Config) { c.HostID = "raw" })
			addr := addrOf(srv)
			if network == "unix" {
				if srv.localName == "" {
					t.Skip("no unix socket on this kernel (SO_PEERPIDFD)")
				}
				addr = srv.localName
			}
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			require.NoError(t, err)
			ours, theirs := os.NewFile(uintptr(fds[0]), "ours"), os.NewFile(uintptr(fds[1]), "theirs")
			defer ours.Close()
			// The child makes a tensorfs memfd, connects, hands the
			// connection and the memfd's number to us, and exits when told.
			child := exec.Command(py, "-c", `
import os, socket, sys
m = os.memfd_create("tensorfs-owner-test"); os.ftruncate(m, 4096); os.pwrite(m, b"x" * 4096, 0)
a = sys.argv[1]
s = socket.socket(socket.AF_UNIX if a.startswith("@") else socket.AF_INET, socket.SOCK_STREAM)
if a.startswith("@"):
    s.connect("\0" + a[1:])
else:
    h, p = a.rsplit(":", 1); s.connect((h, int(p)))
ch = socket.socket(fileno=3)
socket.send_fds(ch, [str(m).encode()], [s.fileno()])
sys.stdin.read()
`, addr)
			child.ExtraFiles = []*os.File{theirs}
			in, err := child.StdinPipe()
			require.NoError(t, err)
			require.NoError(t, child.Start())
			theirs.Close()
			defer func() { in.Close(); child.Wait() }()
			buf, oob := make([]byte, 64), make([]byte, unix.CmsgSpace(4))
			n, oobn, _, _, err := unix.Recvmsg(int(ours.Fd()), buf, oob, 0)
			require.NoError(t, err)
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			require.NoError(t, err)
			got, err := unix.ParseUnixRights(&msgs[0])
			require.NoError(t, err)
			nc, err := net.FileConn(os.NewFile(uintptr(got[0]), "passed"))
			require.NoError(t, err)
			defer nc.Close()
			c := wrapConn(nc, "srv")
			require.NoError(t, clientHandshake(c, "raw", testSecret))
			handle := fmt.Sprintf("memfd:/proc/%d/fd/%s", child.Process.Pid, buf[:n])
			m := Meta{DType: "U8", Shape: "4096", NBytes: 4096}
			require.NoError(t, c.sendJSON(frameRequest, request{Op: "put", Path: "/x", Tensors: []Meta{m}, IPC: []IPCDesc{{Handle: handle, Alloc: 1}}}))
			var r reply
			require.NoError(t, c.recvJSON(frameOK, &r), "the peer names its own memfd")
			require.Equal(t, 1, r.Copied)

			in.Close()
			require.NoError(t, child.Wait())
			require.NoError(t, c.sendJSON(frameRequest, request{Op: "put", Path: "/y", Tensors: []Meta{m}, IPC: []IPCDesc{{Handle: handle, Alloc: 2}}}))
			we := expectError(t, c)
			require.Equal(t, "EXDEV", we.Errno, "%+v", we)
			require.Contains(t, we.Message, "not the peer")
			_, _, ok := local.get("/y")
			require.False(t, ok, "nothing written")
		})
	}
}

// TestLocalSocketSurvivesACancelledDial: a dial on the unix socket that
// fails for a reason that says nothing of the socket (the copy's context
// ended) leaves it to be learned again at the next TCP handshake.
func TestLocalSocketSurvivesACancelledDial(t *testing.T) {
	same := func(c *Config) { c.HostID = "one-host" }
	b := newMemLocal()
	srv := startServer(t, "b", b, testSecret, same)
	a := newMemLocal()
	a.put("/x", []byte("payload"))
	cli := newClient(t, "a", a, testSecret, map[string]string{"b": addrOf(srv)}, same)
	_, err := push(context.Background(), cli, a, "/x", "b", "/y0")
	require.NoError(t, err)
	require.Equal(t, "unix", pooledKind(cli, "b"))
	cli.mu.Lock()
	for _, ic := range cli.idle["b"] {
		ic.c.c.Close()
	}
	cli.idle["b"] = nil
	cli.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = cli.dial(ctx, "b")
	require.Error(t, err)
	_, err = push(context.Background(), cli, a, "/x", "b", "/y1")
	require.NoError(t, err)
	require.Equal(t, "unix", pooledKind(cli, "b"), "back on the socket")
	require.Equal(t, srv.localName, cli.Stats().Peers["b"].Local)
}

// TestLearnLocalSameNamespaces: a socket is learned only from a peer of
// this process's network and PID namespaces (elsewhere its name may be
// anyone's here, and its pid another process's), from this host id, under
// the name dialled.
func TestLearnLocalSameNamespaces(t *testing.T) {
	s, err := New(Config{Name: "a", HostID: "h"}, newMemLocal())
	require.NoError(t, err)
	require.NotEmpty(t, s.ns)
	good := func() *conn {
		return &conn{hostID: "h", name: "b", local: localPrefix + "0123", pid: 42, instance: "i1", ns: s.ns}
	}
	for _, tc := range []struct {
		name string
		mod  func(c *conn)
		want bool
	}{
		{"same", func(*conn) {}, true},
		{"another network namespace", func(c *conn) { c.ns = "net:[1] " + strings.Fields(s.ns)[1] }, false},
		{"another PID namespace", func(c *conn) { c.ns = strings.Fields(s.ns)[0] + " pid:[1]" }, false},
		{"none said", func(c *conn) { c.ns = "" }, false},
		{"another host id", func(c *conn) { c.hostID = "h2" }, false},
		{"another name", func(c *conn) { c.name = "c" }, false},
		{"no pid", func(c *conn) { c.pid = 0 }, false},
		{"not a tensorfs socket", func(c *conn) { c.local = "@other" }, false},
	} {
		s.locals = nil
		c := good()
		tc.mod(c)
		s.learnLocal("b", c)
		_, ok := s.localFor("b")
		require.Equal(t, tc.want, ok, tc.name)
	}
}

// TestLocalSocketSilentPeer: when the peer's own process (its pid
// checked) lets the handshake on its unix socket time out, the dial fails
// with ETIMEDOUT there, without trying TCP too: a silent peer costs one
// --timeout, not two.
func TestLocalSocketSilentPeer(t *testing.T) {
	name := fmt.Sprintf("@tensorfs-test-silent-%d", os.Getpid())
	ln, err := net.Listen("unix", name)
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // silent until the test ends
		}
	}()
	var tcpDials atomic.Int64
	addr := rawServer(t, func(nc net.Conn) { tcpDials.Add(1) })
	cli := newClient(t, "a", newMemLocal(), testSecret, map[string]string{"b": addr}, func(c *Config) { c.Timeout = 300 * time.Millisecond })
	cli.metMu.Lock()
	cli.locals = map[string]localPeer{"b": {sock: name, instance: "i", pid: os.Getpid()}} // as a TCP handshake would have taught it
	cli.metMu.Unlock()
	_, err = cli.dial(context.Background(), "b")
	requireErrno(t, err, syscall.ETIMEDOUT)
	require.Zero(t, tcpDials.Load(), "TCP was tried after the socket's timeout")
	_, ok := cli.localFor("b")
	require.False(t, ok, "forgotten until a TCP handshake offers it again")
	cli.metMu.Lock()
	require.Empty(t, cli.badLocal["b"], "not for good")
	cli.metMu.Unlock()
}

// TestProcessStart: a process's start time, read twice, is the same; a
// process that has exited has none.
func TestProcessStart(t *testing.T) {
	me := processStart(os.Getpid())
	require.NotEmpty(t, me)
	require.Equal(t, me, processStart(os.Getpid()))
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	require.Empty(t, processStart(cmd.Process.Pid), "exited and reaped")
}
