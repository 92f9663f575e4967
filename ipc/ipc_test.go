package ipc

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestExportIDsAndLeases(t *testing.T) {
	r := NewRegistry(nil)
	a := r.Export("memfd:/proc/1/fd/3", 7, 0, 64)
	b := r.Export("memfd:/proc/1/fd/4", 8, 128, 64)
	require.NotEqual(t, a.ID, b.ID)
	l, err := r.Lease(a.ID, "peer b")
	require.NoError(t, err)
	require.Equal(t, a.ID, l.ExportID())
	exports, leases := r.Stats()
	require.Equal(t, 2, exports)
	require.Equal(t, 1, leases)
	l.Release()
	l.Release()
	_, leases = r.Stats()
	require.Zero(t, leases)
	_, err = r.Lease(99, "x")
	require.ErrorIs(t, err, ErrNotFound)
}

func TestRevokeWaitsForRelease(t *testing.T) {
	r := NewRegistry(nil)
	e := r.Export("h", 1, 0, 8)
	l, err := r.Lease(e.ID, "peer")
	require.NoError(t, err)
	released := make(chan time.Time, 1)
	go func() {
		<-l.Revoked() // the holder is told, drops its mapping, then releases
		time.Sleep(50 * time.Millisecond)
		released <- time.Now()
		l.Release()
	}()
	require.NoError(t, r.Revoke(e.ID, 5*time.Second))
	done := time.Now()
	require.False(t, done.Before(<-released), "Revoke returned before the lease was released")
	_, err = r.Lease(e.ID, "late")
	require.ErrorIs(t, err, ErrNotFound)
	exports, leases := r.Stats()
	require.Zero(t, exports)
	require.Zero(t, leases)
	require.ErrorIs(t, r.Revoke(e.ID, time.Second), ErrNotFound)
}

func TestRevokeTimesOutSilentHolder(t *testing.T) {
	r := NewRegistry(nil)
	e := r.Export("h", 1, 0, 8)
	_, err := r.Lease(e.ID, "silent peer")
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, r.Revoke(e.ID, 100*time.Millisecond))
	require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond)
	exports, leases := r.Stats()
	require.Zero(t, exports)
	require.Zero(t, leases)
}

func TestNoLeaseDuringRevoke(t *testing.T) {
	r := NewRegistry(nil)
	e := r.Export("h", 1, 0, 8)
	l, err := r.Lease(e.ID, "peer")
	require.NoError(t, err)
	go func() {
		<-l.Revoked()
		_, err := r.Lease(e.ID, "newcomer")
		require.ErrorIs(t, err, ErrRevoked)
		l.Release()
	}()
	require.NoError(t, r.Revoke(e.ID, 5*time.Second))
}

func TestLeasesCount(t *testing.T) {
	r := NewRegistry(nil)
	e := r.Export("memfd:/proc/1/fd/3", 1, 0, 10)
	n, err := r.Leases(e.ID)
	require.NoError(t, err)
	require.Zero(t, n)
	l, err := r.Lease(e.ID, "fh")
	require.NoError(t, err)
	n, _ = r.Leases(e.ID)
	require.Equal(t, 1, n)
	l.Release()
	n, _ = r.Leases(e.ID)
	require.Zero(t, n)
	require.NoError(t, r.Revoke(e.ID, time.Second))
	_, err = r.Leases(e.ID)
	require.ErrorIs(t, err, ErrNotFound)
}
