package transfer

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
	line := make([]byte, 3)
	_, err = out.Read(line)
	require.NoError(t, err)
	require.Equal(t, "up\n", string(line))
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
