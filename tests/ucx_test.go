//go:build ucx

package tests

import (
	"fmt"
	"slices"
	"testing"
	"time"

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
// transports stats shows under the peer (UCX_TLS=tcp: "tcp/lo"); the copy
// that connected them moves its bytes on it (path "ucx"). A peer that
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
		require.Equal(t, "ucx", last.Path, "the first copy's handshake made the endpoint its bytes moved on: %+v", last)
		require.Equal(t, []string{"tcp/lo"}, last.Transports, "%+v", last)

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
