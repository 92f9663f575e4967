package transfer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// fakeLease is a PeerLease whose revocation the test triggers.
type fakeLease struct {
	revoked  chan struct{}
	released chan struct{}
	once     sync.Once
}

func newFakeLease() *fakeLease {
	return &fakeLease{revoked: make(chan struct{}), released: make(chan struct{})}
}
func (l *fakeLease) Revoked() <-chan struct{} { return l.revoked }
func (l *fakeLease) Release()                 { l.once.Do(func() { close(l.released) }) }

// exportSource is a one-tensor Source that exports "fake:1" (allocation 1,
// export 7); each Export's lease is handed to onExport, which may block.
type exportSource struct {
	meta     Meta
	onExport func(l *fakeLease)
}

func (s *exportSource) Meta() Meta                              { return s.meta }
func (s *exportSource) ReadAt(p []byte, off int64) (int, error) { return len(p), nil }
func (s *exportSource) Close()                                  {}
func (s *exportSource) Export(holder string, accept func(string) bool, keep bool) (IPCDesc, func(), PeerLease, bool) {
	if !accept("fake:1") {
		return IPCDesc{}, nil, nil, false
	}
	l := newFakeLease()
	s.onExport(l)
	return IPCDesc{Handle: "fake:1", Alloc: 1, Export: 7}, func() {}, l, true
}

// exportLocal serves src at every path; Put is a memLocal's.
type exportLocal struct {
	*memLocal
	src *exportSource
}

func (l exportLocal) Get(string, Range) ([]Source, bool, error) { return []Source{l.src}, false, nil }

// gatedMapping is an import whose reads wait for gate (a copy in flight).
type gatedMapping struct {
	gate   chan struct{}
	closed *atomic.Int32
}

func (m gatedMapping) ReadAt(p []byte, off int64) (int, error) { <-m.gate; return len(p), nil }
func (m gatedMapping) Close() error                            { m.closed.Add(1); return nil }

// TestLateDescriptorAfterRevoke: a copy's descriptor handed out just before
// its export is revoked can reach the importer after the revocation did (the
// copy's connection and the lease channel are not ordered). The importer
// must not keep that export leased: the revocation has to be answered
// promptly (not after the peer timeout) and the import closed once the
// copies end.
func TestLateDescriptorAfterRevoke(t *testing.T) {
	var mu sync.Mutex
	var leases []*fakeLease
	exported := make(chan struct{}, 4)
	proceed := make(chan struct{}) // the second export waits for it
	src := &exportSource{meta: Meta{DType: "U8", Shape: "64", NBytes: 64}}
	src.onExport = func(l *fakeLease) {
		mu.Lock()
		leases = append(leases, l)
		n := len(leases)
		mu.Unlock()
		exported <- struct{}{}
		if n == 2 {
			<-proceed
		}
	}
	exp := startServer(t, "e", exportLocal{newMemLocal(), src}, testSecret, func(c *Config) {
		c.HostID = "one"
		c.Timeout = 10 * time.Second
	})
	gate := make(chan struct{})
	var closed atomic.Int32
	into := newMemLocal()
	imp := newClient(t, "i", into, testSecret, map[string]string{"e": addrOf(exp)}, func(c *Config) {
		c.HostID = "one"
		c.Timeout = 10 * time.Second
		c.Importers = map[string]func(string) (Mapping, error){
			"fake": func(string) (Mapping, error) { return gatedMapping{gate, &closed}, nil },
		}
	})
	ctx := context.Background()
	errs := make(chan error, 2)
	// Copy 1 imports and reads (held at the gate): the import is in use.
	go func() { _, err := pull(ctx, imp, into, "e", "/t", "/one"); errs <- err }()
	<-exported
	require.Eventually(t, func() bool { return imp.imports.len() == 1 }, 5*time.Second, time.Millisecond)
	// Copy 2's descriptor is made (its lease taken) before the revocation...
	go func() { _, err := pull(ctx, imp, into, "e", "/t", "/two"); errs <- err }()
	<-exported
	// ...which reaches the importer first: it drops the export's lease and
	// waits for copy 1 to end before answering.
	mu.Lock()
	for _, l := range leases {
		close(l.revoked)
	}
	mu.Unlock()
	require.Eventually(t, func() bool {
		imp.imports.mu.Lock()
		defer imp.imports.mu.Unlock()
		for _, e := range imp.imports.m {
			return len(e.lease) == 0 && e.idle != nil
		}
		return false
	}, 5*time.Second, time.Millisecond, "the revocation reached the importer")
	close(proceed) // copy 2's late descriptor now arrives, while copy 1 reads
	require.Eventually(t, func() bool {
		imp.imports.mu.Lock()
		defer imp.imports.mu.Unlock()
		for _, e := range imp.imports.m {
			return e.refs == 2
		}
		return false
	}, 5*time.Second, time.Millisecond, "copy 2 imported")
	close(gate)
	for range 2 {
		require.NoError(t, <-errs)
	}
	// The lease held on the channel (the first one) ends with the
	// importer's answer, well before the 10 s timeout.
	select {
	case <-leases[0].released:
	case <-time.After(3 * time.Second):
		t.Fatal("the revocation was not answered: the importer kept the late descriptor's lease")
	}
	// Closed with the copies' end, not at the lease channel's idle close
	// (about 2 s later).
	require.Eventually(t, func() bool { return imp.imports.len() == 0 && closed.Load() == 1 }, 500*time.Millisecond, time.Millisecond,
		"the import is closed")
}

// TestHostilePutDescriptors: an authenticated peer of this host sends puts
// whose IPC descriptors name ranges outside the allocation, negative or
// wrapping offsets, handles that are not tensorfs memfds, or another
// allocation id under a handle already cached: each fails with an errno (or
// is refused with EXDEV; a negative offset does not even decode: EPROTO),
// nothing panics, and nothing is committed or left open.
func TestHostilePutDescriptors(t *testing.T) {
	for _, via := range []struct {
		name   string
		authed func(testing.TB, *Service) *conn
	}{{"tcp", authed}, {"unix", authedLocal}} {
		t.Run(via.name, func(t *testing.T) { hostilePutDescriptors(t, via.authed) })
	}
}

func hostilePutDescriptors(t *testing.T, authed func(testing.TB, *Service) *conn) {
	local := newMemLocal()
	srv := startServer(t, "srv", local, testSecret, func(c *Config) { c.HostID = "raw" })
	fd, err := unix.MemfdCreate("tensorfs-hostile", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, unix.Ftruncate(fd, 4096))
	handle := fmt.Sprintf("memfd:/proc/%d/fd/%d", os.Getpid(), fd)
	other, err := os.CreateTemp(t.TempDir(), "plain")
	require.NoError(t, err)
	defer other.Close()
	m := Meta{DType: "U8", Shape: "4096", NBytes: 4096}
	for _, d := range []IPCDesc{
		{Handle: handle, Offset: 1, Alloc: 1},
		{Handle: handle, Offset: 4096, Alloc: 1},
		{Handle: handle, Offset: -1, Alloc: 1},
		{Handle: handle, Offset: math.MaxInt64, Alloc: 1},
		{Handle: handle, Offset: math.MaxInt64 - 100, Alloc: 2},
		{Handle: handle, Offset: math.MinInt64, Alloc: 3},
		{Handle: fmt.Sprintf("memfd:/proc/%d/fd/%d", os.Getpid(), other.Fd()), Alloc: 4},
		{Handle: "memfd:/etc/passwd", Alloc: 5},
		{Handle: "memfd:/proc/self/fd/0", Alloc: 6},
		{Handle: "cuda:00", Alloc: 7},
	} {
		c := authed(t, srv)
		require.NoError(t, c.sendJSON(frameRequest, request{Op: "put", Path: "/x", Tensors: []Meta{m}, IPC: []IPCDesc{d}}))
		we := expectError(t, c)
		want := []string{"EIO", "EXDEV"}
		if d.Offset < 0 {
			want = []string{"EPROTO"}
		}
		require.Contains(t, want, we.Errno, "%+v: %+v", d, we)
	}
	// A well-formed one still works (the connection's daemon is fine).
	c := authed(t, srv)
	require.NoError(t, c.sendJSON(frameRequest, request{Op: "put", Path: "/x", Tensors: []Meta{m}, IPC: []IPCDesc{{Handle: handle, Alloc: 9}}}))
	var r reply
	require.NoError(t, c.recvJSON(frameOK, &r))
	require.Equal(t, 1, r.Copied)
	_, got, ok := local.get("/x")
	require.True(t, ok)
	require.EqualValues(t, 4096, got.NBytes)
	require.Eventually(t, func() bool { return srv.imports.len() == 0 }, time.Second, time.Millisecond)
	requireClean(t, local)
}

// TestPutNamingAnotherProcessRefused: an authenticated peer of this host may
// name only its own process's memory. A tensorfs memfd held by another
// process (another daemon, e.g. of another cluster with another secret) is
// refused (EXDEV: the peer must send the bytes itself), never read; over
// loopback TCP (the socket's holder, from /proc) and over the unix socket
// (the peer's credentials).
func TestPutNamingAnotherProcessRefused(t *testing.T) {
	for _, via := range []struct {
		name   string
		authed func(testing.TB, *Service) *conn
	}{{"tcp", authed}, {"unix", authedLocal}} {
		t.Run(via.name, func(t *testing.T) { putNamingAnotherProcess(t, via.authed) })
	}
}

func putNamingAnotherProcess(t *testing.T, authed func(testing.TB, *Service) *conn) {
	fd, err := unix.MemfdCreate("tensorfs", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	mem := os.NewFile(uintptr(fd), "memfd")
	defer mem.Close()
	require.NoError(t, mem.Truncate(4096))
	// Another process holds it, as its fd 3.
	cmd := exec.Command("sleep", "60")
	cmd.ExtraFiles = []*os.File{mem}
	require.NoError(t, cmd.Start())
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	handle := fmt.Sprintf("memfd:/proc/%d/fd/3", cmd.Process.Pid)
	require.Eventually(t, func() bool {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/3", cmd.Process.Pid))
		return err == nil && strings.HasPrefix(target, "/memfd:tensorfs")
	}, 5*time.Second, time.Millisecond, "the child holds the memfd")

	local := newMemLocal()
	srv := startServer(t, "srv", local, testSecret, func(c *Config) { c.HostID = "raw" })
	c := authed(t, srv)
	m := Meta{DType: "U8", Shape: "4096", NBytes: 4096}
	require.NoError(t, c.sendJSON(frameRequest, request{Op: "put", Path: "/x", Tensors: []Meta{m}, IPC: []IPCDesc{{Handle: handle, Alloc: 1}}}))
	we := expectError(t, c)
	require.Equal(t, "EXDEV", we.Errno, "%+v", we)
	require.Contains(t, we.Message, "not the peer")
	_, _, ok := local.get("/x")
	require.False(t, ok, "nothing was written")
	require.Zero(t, srv.imports.len())
}

// TestProcAddr: /proc/net/tcp addresses (host-order words in hex).
func TestProcAddr(t *testing.T) {
	a := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}
	if binary.NativeEndian.Uint32([]byte{1, 0, 0, 0}) == 1 { // little-endian hosts, as /proc shows them
		require.True(t, procAddrIs("0100007F:1F90", a))
		require.False(t, procAddrIs("0100007F:1F91", a))
		require.True(t, procAddrIs("0000000000000000FFFF00000100007F:1F90", a), "IPv4-mapped in tcp6")
	}
	require.False(t, procAddrIs("garbage", a))
	require.Equal(t, 42, handlePID("memfd:/proc/42/fd/7"))
	require.Zero(t, handlePID("memfd:/proc/self/fd/7"))
	require.Zero(t, handlePID("cuda:00"))
}

// TestExportsWithoutChannel: an exporter that returns a lease when there is
// no lease channel to hold it on (none adopted yet, or ended) gets it back
// at once, and the descriptor is not leased (the importer will not cache).
// It crashed the serving goroutine once (a nil channel), under -race in CI.
func TestExportsWithoutChannel(t *testing.T) {
	var got *fakeLease
	src := &exportSource{meta: Meta{DType: "U8", Shape: "1", NBytes: 1}, onExport: func(l *fakeLease) { got = l }}
	s := &Service{}
	descs, release, ok := s.exports([]Source{src}, &conn{imports: []string{"fake"}}, nil)
	require.True(t, ok)
	require.False(t, descs[0].Leased)
	select {
	case <-got.released:
	default:
		t.Fatal("the lease was not given back")
	}
	release()
}

// TestPullFallsBackToTCPOnceCounted: a pull whose IPC import fails is asked
// again over TCP; the failed attempt is recorded as failed (EXDEV), so stats
// count one copy, on the path it took.
func TestPullFallsBackToTCPOnceCounted(t *testing.T) {
	src := &exportSource{meta: Meta{DType: "U8", Shape: "64", NBytes: 64}, onExport: func(*fakeLease) {}}
	exp := startServer(t, "e", exportLocal{newMemLocal(), src}, testSecret, func(c *Config) { c.HostID = "one" })
	into := newMemLocal()
	imp := newClient(t, "i", into, testSecret, map[string]string{"e": addrOf(exp)}, func(c *Config) {
		c.HostID = "one"
		c.Importers = map[string]func(string) (Mapping, error){
			"fake": func(string) (Mapping, error) { return nil, errors.New("cannot map it here") },
		}
	})
	n, err := pull(context.Background(), imp, into, "e", "/t", "/x")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, _, ok := into.get("/x")
	require.True(t, ok, "the copy landed over TCP")
	st := imp.Stats()
	require.Zero(t, st.Copies.IPC, "the failed IPC attempt is not a copy")
	require.Equal(t, int64(1), st.Copies.TCP)
	require.Len(t, st.Transfers.Recent, 2)
	require.Equal(t, "ipc", st.Transfers.Recent[0].Path)
	require.Contains(t, st.Transfers.Recent[0].Error, "cannot map it here")
	require.Equal(t, "tcp", st.Transfers.Recent[1].Path)
	require.Empty(t, st.Transfers.Recent[1].Error)
}

// slowMapping is an import whose every read takes delay.
type slowMapping struct{ delay time.Duration }

func (m slowMapping) ReadAt(p []byte, off int64) (int, error) {
	time.Sleep(m.delay)
	return len(p), nil
}
func (m slowMapping) Close() error { return nil }

// slowIPCPut is a receiver r and a sender s of one host, and a source of
// total bytes exported to r, which r reads through a buffer of 1 MiB
// chunks, each taking 60 ms (an IPC put that runs long enough to watch).
func slowIPCPut(t *testing.T, total int64) (recv, send *Service, src *exportSource) {
	recv = startServer(t, "r", newMemLocal(), testSecret, func(c *Config) {
		c.HostID = "one"
		c.ChunkSize = 1 << 20
		c.Importers = map[string]func(string) (Mapping, error){
			"fake": func(string) (Mapping, error) { return slowMapping{60 * time.Millisecond}, nil },
		}
	})
	send = newClient(t, "s", newMemLocal(), testSecret, map[string]string{"r": addrOf(recv)}, func(c *Config) { c.HostID = "one" })
	src = &exportSource{meta: Meta{DType: "U8", Shape: strconv.FormatInt(total, 10), NBytes: total}, onExport: func(*fakeLease) {}}
	return recv, send, src
}

// TestIPCPushReportsProgress: during an IPC push the sender's record shows
// the bytes the receiver has copied so far (keepalives with a progressMsg),
// not 0 until the end: `tensorfs cp`'s progress bar reads it.
func TestIPCPushReportsProgress(t *testing.T) {
	const total = 8 << 20
	_, send, src := slowIPCPut(t, total)
	done := make(chan error, 1)
	go func() {
		_, err := send.Send(context.Background(), "r", "/x", []Source{src}, false, "/src")
		done <- err
	}()
	var seen []int64
	for {
		select {
		case err := <-done:
			require.NoError(t, err)
			st := send.Stats()
			require.Equal(t, "ipc", st.Transfers.Recent[0].Path)
			require.EqualValues(t, total, st.Transfers.Recent[0].BytesDone)
			partial := 0
			for _, n := range seen {
				if n > 0 && n < total {
					partial++
				}
			}
			require.GreaterOrEqual(t, partial, 2, "the sender's bytes_done while the copy ran: %v", seen)
			return
		case <-time.After(20 * time.Millisecond):
			if r := send.Stats().Transfers.Recent; len(r) == 1 {
				seen = append(seen, r[0].BytesDone)
			}
		}
	}
}

// TestIPCPullSlowPrepare: the puller of an IPC copy sends keepalives while
// it prepares its destination, so a prepare longer than the timeout (a
// large tensor's pages mapped on a loaded machine) does not make the
// serving peer, which waits for its done, give up (seen as EPIPE).
func TestIPCPullSlowPrepare(t *testing.T) {
	const timeout = 300 * time.Millisecond
	src := &exportSource{meta: Meta{DType: "U8", Shape: "64", NBytes: 64}, onExport: func(*fakeLease) {}}
	exp := startServer(t, "e", exportLocal{newMemLocal(), src}, testSecret, func(c *Config) {
		c.HostID = "one"
		c.Timeout = timeout
	})
	into := newMemLocal()
	imp := newClient(t, "i", into, testSecret, map[string]string{"e": addrOf(exp)}, func(c *Config) {
		c.HostID = "one"
		c.Timeout = timeout
		c.Importers = map[string]func(string) (Mapping, error){
			// The copy itself outlasts two keepalives: a write after the
			// peer gave up fails (EPIPE), where one alone might not.
			"fake": func(string) (Mapping, error) { return slowMapping{timeout}, nil },
		}
	})
	n, err := imp.Receive(context.Background(), Pull{Peer: "e", Path: "/t", Dst: "/x"}, func(isDir bool, metas []Meta) (Dest, error) {
		time.Sleep(3 * timeout)
		return into.Put("/x", isDir, metas)
	})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "ipc", imp.Stats().Transfers.Recent[0].Path)
}

// TestBusyLeaseChannelStays: a channel whose leases end between one copy
// and the next (each copy's export revoked before the next copy, the way a
// tensor re-made per step is) is in use, not idle: it stays open across
// many idle beats, every copy is leased on it, and it closes only once the
// copies stop for leaseIdle. Sampling idleness at the beats closed it
// under the copies, and a copy then lost its lease (seen on a 16-core
// host: an import cache miss where a hit was due, a lease short).
func TestBusyLeaseChannelStays(t *testing.T) {
	leases := make(chan *fakeLease, 1)
	src := &exportSource{meta: Meta{DType: "U8", Shape: "64", NBytes: 64}, onExport: func(l *fakeLease) { leases <- l }}
	const timeout = 300 * time.Millisecond // leaseIdle 150 ms, a beat every 75 ms
	exp := startServer(t, "e", exportLocal{newMemLocal(), src}, testSecret, func(c *Config) {
		c.HostID = "one"
		c.Timeout = timeout
	})
	var closed atomic.Int32
	into := newMemLocal()
	imp := newClient(t, "i", into, testSecret, map[string]string{"e": addrOf(exp)}, func(c *Config) {
		c.HostID = "one"
		c.Timeout = timeout
		c.Importers = map[string]func(string) (Mapping, error){
			"fake": func(h string) (Mapping, error) { return fakeMapping{h, &closed}, nil },
		}
	})
	require.Equal(t, 150*time.Millisecond, imp.leaseIdle())
	ctx := context.Background()
	var first *leaseChan
	deadline := time.Now().Add(12 * imp.leaseIdle())
	n := 0
	for ; time.Now().Before(deadline); n++ {
		_, err := pull(ctx, imp, into, "e", "/t", "/one")
		require.NoError(t, err)
		l := <-leases
		lc := chanOf(imp, exp.instance)
		require.NotNil(t, lc, "copy %d: no lease channel", n)
		if first == nil {
			first = lc
		}
		require.Same(t, first, lc, "copy %d went over a new lease channel: the busy one was closed", n)
		imp.imports.mu.Lock()
		leased := 0
		for _, e := range imp.imports.m {
			leased += len(e.lease)
		}
		imp.imports.mu.Unlock()
		require.Equal(t, 1, leased, "copy %d: the import holds no lease", n)
		// The export retired: revoked, answered, the channel lease-free
		// until the next copy, most of the time between copies.
		close(l.revoked)
		select {
		case <-l.released:
		case <-time.After(5 * time.Second):
			t.Fatalf("copy %d: the revocation was not answered", n)
		}
		time.Sleep(imp.leaseIdle() / 3)
	}
	require.Greater(t, n, 10)
	// Unused now: it closes after about leaseIdle, on both sides.
	require.Eventually(t, func() bool {
		return !first.alive() && chanOf(imp, exp.instance) == nil && chanOf(exp, imp.instance) == nil
	},
		10*imp.leaseIdle(), 5*time.Millisecond, "the unused lease channel stays open")
}

// chanOf is s's live lease channel to instance, or nil; unlike chanTo it is
// no use of the channel (the idle close must not see the test's looks).
func chanOf(s *Service, instance string) *leaseChan {
	s.chanMu.Lock()
	defer s.chanMu.Unlock()
	if lc := s.chans[instance]; lc != nil && lc.alive() {
		return lc
	}
	return nil
}

// TestIPCPushSenderGone: the sender of an IPC put goes away while the
// receiver copies from its memory (which outlives it: a memfd, a CUDA
// allocation): the receiver stops at its next piece, once a keepalive
// finds the connection closed, and ends the transfer with that error. It
// ran the copy to its end before, its destination pinned for seconds after
// a kill -9 of the sender (a breaker helper's find).
func TestIPCPushSenderGone(t *testing.T) {
	const total = 64 << 20 // 64 pieces of 60 ms: about 4 s to the end
	recv, send, src := slowIPCPut(t, total)
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, err := send.Send(ctx, "r", "/x", []Source{src}, false, "/src")
		done <- err
	}()
	require.Eventually(t, func() bool {
		r := recv.Stats().Transfers.Recent
		return len(r) == 1 && r[0].BytesDone > 0
	}, 5*time.Second, 5*time.Millisecond, "the receiver copies")
	cancel() // Send closes its connection, as the sender's death would
	closed := time.Now()
	require.Error(t, <-done)
	require.Eventually(t, func() bool { return recv.Stats().Transfers.Active == 0 }, 3*time.Second, 5*time.Millisecond)
	stopped := time.Since(closed)
	r := recv.Stats().Transfers.Recent[0]
	require.Contains(t, r.Error, "went away", "%+v", r)
	require.Less(t, r.BytesDone, int64(total), "stopped before its end: %+v", r)
	require.Less(t, stopped, time.Second, "stopped within a keepalive and a piece of the close")
}
