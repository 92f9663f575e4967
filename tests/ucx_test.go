//go:build ucx

package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/internal/testutil"
	"github.com/tensorfs/tensorfs/xattrs"
)

// ucxPair starts daemons a and b on two host ids (the TCP path) that
// know each other, each with its own extra flags; restartB starts b again
// (after it was stopped) with other extra flags.
func ucxPair(t *testing.T, aFlags, bFlags []string) (a, b *daemon, restartB func(flags ...string) *daemon) {
	t.Helper()
	pa, pb := testutil.FreePort(t), testutil.FreePort(t)
	secret := secretFile(t, "a shared secret of enough bytes")
	common := []string{"--secret-file", secret, "--timeout", "3s"}
	a = startDaemon(t, append(append([]string{"--name", "a", "--host-id", "host-a", "--listen", fmt.Sprintf("127.0.0.1:%d", pa), "--peer", fmt.Sprintf("b=127.0.0.1:%d", pb)}, common...), aFlags...)...)
	startB := func(flags ...string) *daemon {
		return startDaemon(t, append(append([]string{"--name", "b", "--host-id", "host-b", "--listen", fmt.Sprintf("127.0.0.1:%d", pb), "--peer", fmt.Sprintf("a=127.0.0.1:%d", pa)}, common...), flags...)...)
	}
	return a, startB(bFlags...), startB
}

// TestUCXEndpoints: two daemons built with UCX exchange worker addresses
// in their handshake and each makes an endpoint to the other, whose
// transports stats shows under the peer (UCX_TLS=tcp: "tcp/lo"); over
// tcp UCX emulates puts and gets (the endpoint is not one-sided), so the
// copies stay on tensorfs's TCP (path "tcp") and the log says why; the
// same over UCX 1.13's shared memory. A peer that
// restarts without UCX has its old endpoint closed at its new handshake.
// A daemon with --transport tcp offers no address and makes no endpoint,
// so neither side has one.
func TestUCXEndpoints(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	t.Setenv("UCX_NET_DEVICES", "lo")
	t.Run("both offer", func(t *testing.T) {
		a, b, restartB := ucxPair(t, nil, nil)
		data := fill(64<<10, 3)
		writeTensor(t, a.path("x"), data)
		setx(t, a.path("x"), xattrs.CopyTo, "b:/x")
		requireContent(t, b.path("x"), data)
		require.Eventually(t, func() bool {
			return slices.Contains(a.stats().Peers["b"].UCX, "tcp/lo") && slices.Contains(b.stats().Peers["a"].UCX, "tcp/lo")
		}, 5*time.Second, 20*time.Millisecond, "a: %+v, b: %+v", a.stats().Peers, b.stats().Peers)
		st := a.stats()
		last := st.Transfers.Recent[len(st.Transfers.Recent)-1]
		require.Equal(t, "tcp", last.Path, "an endpoint that is not one-sided carries no bytes: %+v", last)
		a.requireLog("ucx: endpoint to the peer is not one-sided (UCX would emulate puts and gets")
		require.Regexp(t, `is not one-sided \(UCX would emulate puts and gets.*\); copies with it stay on TCP`, a.log.String())
		require.False(t, st.Peers["b"].UCXOneSided)
		require.Contains(t, cliOK(t, "status", a.mnt), "tcp/lo (copies on tcp)", "status shows the endpoint and that it carries no bytes")

		// b restarts without UCX: a's endpoint to the old b goes at the
		// new b's first handshake.
		b.kill()
		b = restartB("--transport", "tcp")
		setx(t, a.path("x"), xattrs.CopyTo, "b:/x")
		requireContent(t, b.path("x"), data)
		require.Empty(t, a.stats().Peers["b"].UCX, "no endpoint to a b without UCX")
	})
	t.Run("one on tcp", func(t *testing.T) {
		a, b, _ := ucxPair(t, []string{"--transport", "tcp"}, nil)
		data := fill(4096, 4)
		writeTensor(t, a.path("x"), data)
		setx(t, a.path("x"), xattrs.CopyTo, "b:/x")
		requireContent(t, b.path("x"), data)
		writeTensor(t, b.path("y"), data)
		setx(t, b.path("y"), xattrs.CopyTo, "a:/y")
		requireContent(t, a.path("y"), data)
		require.Empty(t, a.stats().Peers["b"].UCX)
		require.Empty(t, b.stats().Peers["a"].UCX)
	})
}

// TestUCXWholeCopies: whole tensors and directory trees between two hosts
// move on UCX (--ucx-any-endpoint: ucx-sm over UCX_TLS=sm,self,
// ucx-tcp-emulated over UCX_TLS=tcp): a push of a new
// tensor and over an existing one (into the temporary, then renamed), a
// pull of a tensor and of a range, a directory tree both ways; every byte
// arrives, stats count the copies as ucx with the endpoint's transports,
// and no pin or temporary is left on either side.
func TestUCXWholeCopies(t *testing.T) {
	for _, p := range copyPaths(false) {
		if p.path != "ucx" {
			continue
		}
		t.Run(p.name, func(t *testing.T) {
			a, b := pairOn(t, p)
			x := fill(3<<20+17, 1)
			writeTensor(t, a.path("x"), x)
			setx(t, a.path("x"), xattrs.CopyTo, "b:/x")
			requireContent(t, b.path("x"), x)
			y := fill(5000, 2)
			writeTensor(t, a.path("x"), y)
			setx(t, a.path("x"), xattrs.CopyTo, "b:/x")
			requireContent(t, b.path("x"), y)

			writeTensor(t, b.path("w"), x)
			writeTensor(t, a.path("w"), nil)
			setx(t, a.path("w"), xattrs.CopyFrom, "b:/w")
			requireContent(t, a.path("w"), x)
			writeTensor(t, a.path("part"), nil)
			setx(t, a.path("part"), xattrs.CopyFrom, "b:/w@4096+8192")
			requireContent(t, a.path("part"), x[4096:4096+8192])

			require.NoError(t, os.MkdirAll(a.path("tree/sub"), 0o755))
			for i := range 20 {
				writeTensor(t, a.path(fmt.Sprintf("tree/t%d", i)), fill(1000*(i+1), byte(i)))
			}
			writeTensor(t, a.path("tree/sub/z"), fill(70000, 9))
			setx(t, a.path("tree"), xattrs.CopyTo, "b:/tree")
			require.NoError(t, os.Mkdir(a.path("back"), 0o755))
			setx(t, a.path("back"), xattrs.CopyFrom, "b:/tree")
			for _, d := range []string{b.path("tree"), a.path("back")} {
				for i := range 20 {
					requireContent(t, filepath.Join(d, fmt.Sprintf("t%d", i)), fill(1000*(i+1), byte(i)))
				}
				requireContent(t, filepath.Join(d, "sub/z"), fill(70000, 9))
			}
			st := a.stats()
			require.EqualValues(t, 6, st.Copies.UCX, "every copy one-sided: %+v", st.Copies)
			require.Zero(t, st.Copies.TCP, "%+v", st.Copies)
			for _, r := range st.Transfers.Recent {
				require.Equal(t, "ucx", r.Path, "%+v", r)
				require.NotEmpty(t, r.Transports, "%+v", r)
			}

			// No bytes to move: an empty tensor and an empty tree, both
			// ways (on TCP: there is no memory to reach).
			writeTensor(t, b.path("empty"), nil)
			writeTensor(t, a.path("e2"), fill(10, 1))
			setx(t, a.path("e2"), xattrs.CopyFrom, "b:/empty")
			requireContent(t, a.path("e2"), nil)
			setx(t, a.path("e2"), xattrs.CopyTo, "b:/e3")
			requireContent(t, b.path("e3"), nil)
			require.NoError(t, os.Mkdir(b.path("none"), 0o755))
			require.NoError(t, os.Mkdir(a.path("none2"), 0o755))
			setx(t, a.path("none2"), xattrs.CopyFrom, "b:/none")
			setx(t, a.path("none2"), xattrs.CopyTo, "b:/none3")
			for _, d := range []*daemon{a, b} {
				require.Zero(t, d.stats().Live.Pins)
			}
			// UCX 1.13 emulates RMA into registered memory over shared
			// memory; 1.19 does it one-sided on cma. Neither detects a
			// dead peer there. UCX's tcp emulates, and detects.
			peer := a.stats().Peers["b"]
			require.True(t, peer.UCXCarries, "--ucx-any-endpoint: %+v", peer)
			if p.tls == "tcp" {
				require.False(t, peer.UCXOneSided, "tcp: %+v", peer)
				require.True(t, peer.UCXPeerFailure, "tcp: %+v", peer)
				require.Regexp(t, `(?m)^\s+b\s.*tcp/lo \(any endpoint\)\s*$`, cliOK(t, "status", a.mnt), "status shows the tcp endpoint, used although emulated")
			} else {
				require.False(t, peer.UCXPeerFailure, "shared memory: %+v", peer)
				require.Regexp(t, `(?m)^\s+b\s.*memory\S* \(any endpoint\)\s*$`, cliOK(t, "status", a.mnt), "status shows the shared-memory endpoint, used although unguarded")
			}
		})
	}
}

// TestUCXRequired: with --transport ucx, a copy with a peer of another
// host that offers no UCX, or whose endpoint is not one-sided (UCX_TLS=tcp,
// and sm with UCX 1.13), is refused (EPROTONOSUPPORT) and moves nothing, either
// way: a daemon on ucx refuses a peer's copies over TCP too. (With auto
// they go on TCP: TestUCXEndpoints.)
func TestUCXRequired(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	t.Setenv("UCX_NET_DEVICES", "lo")
	a, b, _ := ucxPair(t, []string{"--transport", "ucx"}, []string{"--transport", "tcp"})
	data := fill(4096, 5)
	writeTensor(t, a.path("x"), data)
	err := unix.Setxattr(a.path("x"), xattrs.CopyTo, []byte("b:/x"), 0)
	require.ErrorIs(t, err, syscall.EPROTONOSUPPORT)
	_, err = os.Stat(b.path("x"))
	require.ErrorIs(t, err, os.ErrNotExist, "nothing moved")
	writeTensor(t, b.path("y"), data)

	// a, on ucx, also refuses b's copies over TCP, both ways.
	err = unix.Setxattr(b.path("y"), xattrs.CopyTo, []byte("a:/y2"), 0)
	require.ErrorIs(t, err, syscall.EPROTONOSUPPORT, "a push to a daemon on --transport ucx over TCP")
	writeTensor(t, b.path("z"), nil)
	err = unix.Setxattr(b.path("z"), xattrs.CopyFrom, []byte("a:/x"), 0)
	require.ErrorIs(t, err, syscall.EPROTONOSUPPORT, "a pull from a daemon on --transport ucx over TCP")
	_, err = os.Stat(a.path("y2"))
	require.ErrorIs(t, err, os.ErrNotExist, "nothing moved")

	// Both with UCX, over UCX_TLS=tcp and over UCX 1.13's shared
	// memory: an endpoint, but not one-sided (UCX would emulate the gets);
	// ucx refuses to copy on it, and the error says what would.
	for _, tls := range []string{"tcp", "sm,self"} {
		t.Setenv("UCX_TLS", tls)
		c, d, _ := ucxPair(t, []string{"--transport", "ucx"}, []string{"--transport", "ucx"})
		writeTensor(t, c.path("x"), data)
		err = unix.Setxattr(c.path("x"), xattrs.CopyTo, []byte("b:/x"), 0)
		require.ErrorIs(t, err, syscall.EPROTONOSUPPORT, tls)
		c.requireLog("--ucx-any-endpoint would use the endpoint", tls)
		_, err = os.Stat(d.path("x"))
		require.ErrorIs(t, err, os.ErrNotExist, "nothing moved (%s)", tls)
		require.False(t, c.stats().Peers["b"].UCXCarries, tls)
	}
}

// TestUCXAnyEndpointOneSide: --ucx-any-endpoint on one side only. Over
// shared memory (not guarded: emulated with UCX 1.13, unguarded cma with
// 1.19) a asks for UCX copies, and b, whose own endpoint to a does not
// carry copies, answers both its pulls and its pushes on TCP: b's worker
// never serves emulated gets, which would abort it if a died mid-copy
// (b served a pull on UCX before). Every byte arrives either way.
func TestUCXAnyEndpointOneSide(t *testing.T) {
	t.Setenv("UCX_TLS", "sm,self")
	a, b, _ := ucxPair(t, []string{"--ucx-any-endpoint"}, nil)
	x := fill(1<<20+3, 6)
	writeTensor(t, b.path("x"), x)
	writeTensor(t, a.path("y"), nil)
	setx(t, a.path("y"), xattrs.CopyFrom, "b:/x")
	requireContent(t, a.path("y"), x)
	setx(t, a.path("y"), xattrs.CopyTo, "b:/z")
	requireContent(t, b.path("z"), x)
	require.True(t, a.stats().Peers["b"].UCXCarries, "a's endpoint carries (--ucx-any-endpoint)")
	require.False(t, b.stats().Peers["a"].UCXCarries, "b's does not")
	for _, d := range []*daemon{a, b} {
		st := d.stats()
		require.Zero(t, st.Copies.UCX, "%+v", st.Copies)
		require.EqualValues(t, 2, st.Copies.TCP, "%+v", st.Copies)
		for _, r := range st.Transfers.Recent {
			// a's push first asked for UCX: that attempt's record says
			// b answered on TCP, and the next one is the copy.
			if r.Error == "" {
				require.Equal(t, "tcp", r.Path, "%+v", r)
			} else {
				require.Contains(t, r.Error, "the peer answered on TCP", "%+v", r)
			}
		}
	}
}

// TestUCXRequiredSeveralPeers: a call of several transfers (two peers, a
// pull and a push, a tree here and a peer's line) one of which a node on
// --transport ucx refuses for its transport (EPROTONOSUPPORT) writes
// nothing anywhere: the checks that run before any transfer refuse it as
// the transfer would, on the peer's side and on the caller's.
func TestUCXRequiredSeveralPeers(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp") // an endpoint, but not one-sided: ucx refuses it
	t.Setenv("UCX_NET_DEVICES", "lo")
	for _, on := range []string{"b", "a"} {
		t.Run(on+" on ucx", func(t *testing.T) {
			ds := clusterOf(t, []string{"a", "b", "c"}, map[string][]string{on: {"--transport", "ucx"}}, "--transport", "tcp")
			a, b, c := ds["a"], ds["b"], ds["c"]
			snap := severalPeers(t, a, b, c)
			before := snap()
			for _, tc := range []struct{ on, attr, v string }{
				{a.mnt, xattrs.Batch, "/src c:/dst@0\n/src b:/dst@0"},
				{a.path("loc"), xattrs.CopyFrom, "c:/dst@0+100 @0\nb:/dst@0+100 @200"},
				{a.mnt, xattrs.Batch, "c:/dst@0+100 /loc@0\n/src b:/dst@0"},
				{a.mnt, xattrs.Batch, "/tree /tree2@0\n/src b:/dst@0"},
				{a.path("loc"), xattrs.CopyFrom, "/src@0+100 @0\nb:/dst@0+100 @200"},
			} {
				err := unix.Setxattr(tc.on, tc.attr, []byte(tc.v), 0)
				require.ErrorIs(t, err, syscall.EPROTONOSUPPORT, "%s %q", tc.attr, tc.v)
				require.Equal(t, before, snap(), "%s %q wrote something", tc.attr, tc.v)
			}
			for _, d := range []*daemon{a, b, c} {
				require.Zero(t, d.stats().Live.Pins)
			}
		})
	}
}
